from __future__ import annotations

from django.conf import settings
from django.db import models


class Document(models.Model):
    class State(models.TextChoices):
        UPLOADED = "uploaded", "Uploaded"
        EXTRACTING = "extracting", "Extracting text"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=255)
    filename = models.CharField(max_length=255)
    content_type = models.CharField(max_length=127, blank=True)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    file = models.FileField(upload_to="documents/%Y/%m/", max_length=500)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UPLOADED)
    failure_reason = models.TextField(blank=True)
    pages_total = models.PositiveIntegerField(null=True, blank=True)
    pages_done = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"])]
        constraints = [
            models.UniqueConstraint(fields=["owner", "sha256"], name="document_unique_bytes_per_owner"),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_finished(self) -> bool:
        return self.state in {self.State.READY, self.State.FAILED}


class Page(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pages")
    number = models.PositiveIntegerField()  # 1-based, as people count pages
    text = models.TextField()

    class Meta:
        ordering = ["document", "number"]
        constraints = [models.UniqueConstraint(fields=["document", "number"], name="page_unique_number")]

    def __str__(self) -> str:
        return f"{self.document} p.{self.number}"
