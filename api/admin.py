"""API tokens in the admin: create one for someone (shown once), revoke, see which are in use.

The token's hash is never shown nor editable; a new token's value is shown once, on the page that
answers the POST that added it (not in a message: Django keeps those in a cookie). Creation and revocation go through ``api.services``
and are recorded in the audit log, as on the token page."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from api import services
from api.forms import AdminTokenAddForm, AdminTokenChangeForm
from api.models import ApiToken, Scope
from console.models import AuditEvent


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("active", "Active"), ("expired", "Expired"), ("revoked", "Revoked")]

    def queryset(self, request, queryset):
        now = timezone.now()
        expired = Q(expires_at__isnull=False, expires_at__lte=now)
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True).exclude(expired)
        if self.value() == "expired":
            return queryset.filter(expired, revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class ScopeFilter(admin.SimpleListFilter):
    title = "scope"
    parameter_name = "scope"

    def lookups(self, request, model_admin):
        return [(value, value) for value in Scope.values]

    def queryset(self, request, queryset):
        if self.value() in Scope.values:
            return queryset.filter(scopes__contains=[self.value()])
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "user",
        "prefix",
        "scope_list",
        "status",
        "created_at",
        "expires_at",
        "last_used_at",
    )
    list_filter = (StatusFilter, ScopeFilter, "user__is_staff")
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user",)
    actions = ["revoke"]
    add_fieldsets = ((None, {"fields": ("user", "name", "scopes", "expires_at", "rate_limit_per_minute")}),)
    readonly_fields = (
        "user",
        "prefix",
        "scope_list",
        "status",
        "created_at",
        "last_used_at",
        "revoked_at",
        "jobs",
    )
    fieldsets = (
        (None, {"fields": ("user", "name", "prefix", "scope_list", "status")}),
        ("Dates", {"fields": ("created_at", "expires_at", "last_used_at", "revoked_at")}),
        ("Use", {"fields": ("rate_limit_per_minute", "jobs")}),
    )

    @admin.display(description="scopes")
    def scope_list(self, token: ApiToken) -> str:
        return ", ".join(token.scopes)

    @admin.display(description="status")
    def status(self, token: ApiToken) -> str:
        return token.status

    @admin.display(description="jobs")
    def jobs(self, token: ApiToken) -> str:
        url = reverse("admin:inference_job_changelist") + f"?api_token__id__exact={token.pk}"
        return format_html('<a href="{}">{} job(s) started with this token</a>', url, token.jobs.count())

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        """A token acts as its user: only a superuser may issue one for someone else (a staff
        member with the add permission would otherwise read whatever that person may read)."""
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["queryset"] = db_field.related_model.objects.filter(pk=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_fieldsets(self, request, obj=None):
        return self.add_fieldsets if obj is None else self.fieldsets

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.readonly_fields

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = AdminTokenAddForm if obj is None else AdminTokenChangeForm
        kwargs["fields"] = None  # the form's own Meta.fields
        return super().get_form(request, obj, change=change, **kwargs)

    def save_model(self, request, obj, form, change):
        if not change:  # AdminTokenAddForm created it with token_create
            services.token_audit(request, AuditEvent.Action.TOKEN_CREATE, obj)
            obj.raw_token = form.raw_token  # shown by response_add, then gone
            return
        obj.save(update_fields=[name for name in form.changed_data if name in form.Meta.fields])

    def response_add(self, request, obj, post_url_continue=None):
        """The new token, on the page that answers the POST: not in a message, which Django keeps in
        a cookie until the next page."""
        raw = getattr(obj, "raw_token", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "token": obj,
            "raw_token": raw,
            "title": "API token created",
            "change_url": reverse("admin:api_apitoken_change", args=[obj.pk]),
            "list_url": reverse("admin:api_apitoken_changelist"),
        }
        response = TemplateResponse(request, "admin/api/apitoken/created.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True).select_related("user"):
            if services.token_revoke(token=token):
                services.token_audit(request, AuditEvent.Action.TOKEN_REVOKE, token)
                revoked += 1
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)
