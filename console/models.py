from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Who read, shared, deleted or exported what, who created or revoked which API token, and when.
    Written by ``console.services.audit``; never changed afterwards (the admin shows it read-only).
    The title is kept as it was, so an event stays readable after its document is deleted."""

    class Action(models.TextChoices):
        UPLOAD = "upload", "uploaded"
        READ = "read", "read"
        DOWNLOAD = "download", "downloaded"
        SHARE = "share", "shared"
        DELETE = "delete", "deleted"
        EXPORT = "export", "exported"
        TOKEN_CREATE = "token_create", "created API token"
        TOKEN_REVOKE = "token_revoke", "revoked API token"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    username = models.CharField(max_length=150)  # as it was at the time
    action = models.CharField(max_length=16, choices=Action.choices)
    document = models.ForeignKey(
        "documents.Document", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    job = models.ForeignKey("inference.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    target = models.CharField(max_length=300)  # "Lease of Unit 4", "Summary of Lease of Unit 4 (docx)"
    detail = models.JSONField(default=dict, blank=True)  # e.g. the groups a document is now shared with
    address = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["user", "-at"]), models.Index(fields=["action", "-at"])]

    def __str__(self) -> str:
        return f"{self.username} {self.get_action_display()} {self.target}"
