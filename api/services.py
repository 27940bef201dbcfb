"""Writes for API tokens: create (the token is returned once, never stored), revoke, mark used."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from api.models import ApiToken, Scope

TOKEN_PREFIX = "dapp_"  # noqa: S105 - a marker that says what a string is, not a secret
LAST_USED_RESOLUTION = timedelta(minutes=1)  # at most one write per token per minute for "last used"


class TokenRejected(ValueError):
    """The token cannot be created as asked; the message is for the user."""


def token_sha256(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_raw_token() -> tuple[str, str]:
    """(token, prefix): ``dapp_`` + 8 hex characters that identify it + ``_`` + the secret."""
    ident = secrets.token_hex(4)
    return f"{TOKEN_PREFIX}{ident}_{secrets.token_urlsafe(32)}", f"{TOKEN_PREFIX}{ident}"


def token_create(
    *,
    user: User,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    rate_limit_per_minute: int | None = None,
    max_streams: int | None = None,
) -> tuple[ApiToken, str]:
    """A new token for ``user``. Returns the row and the token itself, which is shown once."""
    name = (name or "").strip()
    if not name:
        raise TokenRejected("Give the token a name that says what uses it.")
    scopes = sorted(set(scopes))
    if not scopes:
        raise TokenRejected("Choose at least one scope.")
    unknown = [s for s in scopes if s not in Scope.values]
    if unknown:
        raise TokenRejected(f"Unknown scope {unknown[0]!r}; choose among {', '.join(Scope.values)}.")
    if Scope.ADMIN in scopes and not user.is_staff:
        raise TokenRejected("Only staff accounts can have a token with the admin scope.")
    if expires_at is not None and expires_at <= timezone.now():
        raise TokenRejected("The expiry date must be in the future.")
    if max_streams is not None and max_streams < 1:
        raise TokenRejected("The stream limit must be at least 1 (empty: the default).")
    if rate_limit_per_minute is not None and rate_limit_per_minute < 1:
        raise TokenRejected("The rate limit must be at least 1 request a minute (empty: the default).")
    for attempt in range(5):  # the 8-character prefix is unique: draw again in the rare clash
        raw, prefix = new_raw_token()
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(
                    user=user,
                    name=name[:100],
                    prefix=prefix,
                    token_sha256=token_sha256(raw),
                    scopes=scopes,
                    expires_at=expires_at,
                    rate_limit_per_minute=rate_limit_per_minute,
                    max_streams=max_streams,
                )
        except IntegrityError:
            if attempt == 4:
                raise
            continue
        return token, raw
    raise AssertionError("unreachable")


def token_revoke(*, token: ApiToken) -> bool:
    """Revoke at once; requests with it fail from now on. False if it was revoked already."""
    return bool(ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()))


def token_audit(request, action: str, token: ApiToken) -> None:
    """The audit log's record of a token created or revoked, by the UI or the admin."""
    from console.services import audit

    audit(
        request,
        action,
        target=str(token),
        prefix=token.prefix,
        scopes=token.scopes,
        owner=token.user.get_username(),
        expires_at=token.expires_at.isoformat() if token.expires_at else None,
    )


def token_mark_used(*, token: ApiToken) -> None:
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
