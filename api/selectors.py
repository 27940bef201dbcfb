"""Reads for API tokens."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import F, QuerySet

from api.models import ApiToken
from api.services import TOKEN_PREFIX, token_sha256


def token_for(raw: str) -> ApiToken | None:
    """The active token ``raw`` names, with its (active) user; None for anything else."""
    if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("user").filter(token_sha256=token_sha256(raw)).first()
    if token is None or not token.is_active or not token.user.is_active:
        return None
    return token


def tokens_of(user: User) -> QuerySet[ApiToken]:
    """Active and expired tokens first (not revoked), newest first; then the revoked ones."""
    return ApiToken.objects.filter(user=user).order_by(F("revoked_at").desc(nulls_first=True), "-created_at")
