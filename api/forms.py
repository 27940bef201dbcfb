"""Forms for personal API tokens: the token page's "create" form and the admin's add and change
forms. Whether a token may be created (name, scopes, admin only for staff, expiry in the future)
is decided by ``api.services.token_create``; these forms only turn the request into its arguments
and show its refusal where the person can read it."""

from __future__ import annotations

from datetime import datetime, time, timedelta

from django import forms
from django.utils import timezone

from api import services
from api.models import ApiToken, Scope

NEVER = "never"
ON_DATE = "date"
EXPIRY_CHOICES = [
    ("7", "In 7 days"),
    ("30", "In 30 days"),
    ("90", "In 90 days"),
    ("365", "In a year"),
    (ON_DATE, "On the date below"),
    (NEVER, "Never"),
]
DEFAULT_EXPIRY = "90"


def offered_scopes(user) -> list[tuple[str, str]]:
    """The scopes the token page offers ``user``: admin only to staff."""
    return [(value, label) for value, label in Scope.choices if value != Scope.ADMIN or user.is_staff]


class TokenCreateForm(forms.Form):
    """The token page's form. ``scopes`` accepts every scope, so that a refused one (admin for a
    non-staff account) is refused by the service with its own message, not as "not a choice"."""

    name = forms.CharField(max_length=100, help_text="What uses it, e.g. “case system” or “mail plug-in”.")
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        initial=[Scope.READ],
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one scope."},
    )
    expires = forms.ChoiceField(choices=EXPIRY_CHOICES, initial=DEFAULT_EXPIRY)
    expires_on = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    @property
    def offered_scopes(self) -> list[tuple[str, str]]:
        return offered_scopes(self.user)

    def clean(self):
        cleaned = super().clean()
        expires, on = cleaned.get("expires"), cleaned.get("expires_on")
        if expires == ON_DATE and on is None:
            self.add_error("expires_on", "Choose the date the token stops working.")
        elif expires not in (None, ON_DATE) and on is not None:
            self.add_error("expires_on", "Choose “On the date below” to use this date, or clear it.")
        return cleaned

    def expires_at(self) -> datetime | None:
        """When the token stops working: a number of days from now, the start of the chosen day
        (in the appliance's time zone), or never."""
        expires = self.cleaned_data["expires"]
        if expires == NEVER:
            return None
        if expires == ON_DATE:
            return datetime.combine(self.cleaned_data["expires_on"], time.min, tzinfo=timezone.get_current_timezone())
        return timezone.now() + timedelta(days=int(expires))

    def create(self) -> tuple[ApiToken, str] | None:
        """Create the token; on refusal, the service's message becomes the form's error."""
        try:
            return services.token_create(
                user=self.user,
                name=self.cleaned_data["name"],
                scopes=self.cleaned_data["scopes"],
                expires_at=self.expires_at(),
            )
        except services.TokenRejected as exc:
            self.add_error(None, str(exc))
            return None


class AdminTokenAddForm(forms.ModelForm):
    """The admin's add form. The token is created by ``token_create`` once everything else is
    valid (as Django's own user creation form checks passwords in ``_post_clean``); a refusal is
    shown on the form. The admin saves inside one transaction, so a later failure undoes it."""

    scopes = forms.MultipleChoiceField(choices=Scope.choices, widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = ApiToken
        fields = ("user", "name", "scopes", "expires_at", "rate_limit_per_minute")

    raw_token: str | None = None

    def _post_clean(self):
        super()._post_clean()
        if self.errors:
            return
        try:
            self.instance, self.raw_token = services.token_create(
                user=self.cleaned_data["user"],
                name=self.cleaned_data["name"],
                scopes=self.cleaned_data["scopes"],
                expires_at=self.cleaned_data.get("expires_at"),
                rate_limit_per_minute=self.cleaned_data.get("rate_limit_per_minute"),
            )
        except services.TokenRejected as exc:
            self.add_error(None, str(exc))


class AdminTokenChangeForm(forms.ModelForm):
    """The admin's change form: what may change after a token is issued. Its scopes and owner stay
    as created (revoke it and create another), and its hash is never shown."""

    class Meta:
        model = ApiToken
        fields = ("name", "expires_at", "rate_limit_per_minute")
