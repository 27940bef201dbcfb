"""Personal API tokens: what internal tools and OpenAI-compatible clients authenticate with.

Only a SHA-256 of the token is stored. A token is 32 random bytes, so a fast hash is enough: there
is nothing to guess a dictionary word from, and a stolen table gives no usable token. The prefix
(the first characters, not secret) lets a person tell tokens apart in lists and logs.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


class Scope(models.TextChoices):
    READ = "read", "read: list, read, search, stream, usage"
    WRITE = "write", "write: upload, share, delete, start and cancel jobs, chat completions"
    ADMIN = "admin", "admin: everyone's usage (staff accounts only)"


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What uses it, e.g. “case system” or “mail plug-in”.")
    prefix = models.CharField(max_length=16, unique=True, help_text="The token's first characters (not secret).")
    token_sha256 = models.CharField(max_length=64, unique=True, editable=False)
    scopes = ArrayField(models.CharField(max_length=8, choices=Scope.choices), default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    rate_limit_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests per minute; empty: the appliance's default.",
    )
    max_streams = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Streams its person may have open at once through it; empty: the appliance's default.",
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def status(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "active"

    def allows(self, scope: str) -> bool:
        if scope == Scope.ADMIN and not self.user.is_staff:
            return False  # a staff member's token outlives their staff status: admin goes with it
        return scope in self.scopes
