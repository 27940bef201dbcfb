"""``/account/tokens/``: a signed-in person's own API tokens: list, create, revoke.

A new token is shown once, in the response to the POST that created it: it is never put into the
session, a message or a URL, and the page is not cached. Afterwards only its prefix is known."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from api import selectors, services
from api.forms import TokenCreateForm
from api.models import ApiToken
from console.models import AuditEvent


def _render(request, form: TokenCreateForm, *, created: ApiToken | None = None, raw: str | None = None):
    tokens = selectors.tokens_of(request.user)
    return render(
        request,
        "api/tokens.html",
        {
            "form": form,
            "tokens": tokens,
            "created": created,
            "raw_token": raw,
            "tomorrow": timezone.localdate() + timedelta(days=1),
        },
    )


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    if request.method == "GET":
        return _render(request, TokenCreateForm(user=request.user))
    form = TokenCreateForm(request.POST, user=request.user)
    created = form.create() if form.is_valid() else None
    if created is None:
        return _render(request, form)
    token, raw = created
    services.token_audit(request, AuditEvent.Action.TOKEN_CREATE, token)
    return _render(request, TokenCreateForm(user=request.user), created=token, raw=raw)


@login_required
@require_POST
def revoke(request, token_id: int):
    token = selectors.tokens_of(request.user).filter(pk=token_id).first()
    if token is None:
        raise Http404("No such token.")
    if services.token_revoke(token=token):
        services.token_audit(request, AuditEvent.Action.TOKEN_REVOKE, token)
        messages.success(request, f"The token “{token.name}” ({token.prefix}…) is revoked; requests with it now fail.")
    else:
        messages.info(request, f"The token “{token.name}” was revoked already.")
    return redirect("tokens:list")
