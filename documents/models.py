from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from pgvector.django import HnswIndex, VectorField

# all-MiniLM-L6-v2 writes 384 numbers per passage. Another embedding model with another size
# needs a migration of this column (the HNSW index is built for one size).
EMBEDDING_DIMENSIONS = 384


class Batch(models.Model):
    """Files uploaded together (several at once, or a zip of a folder), followed on one page.

    Its documents point at it; how many are done, failed or cancelled is counted from them, so
    the counts cannot drift. What never became a document (a zip member that was not a supported
    document, an unsafe name, a nested archive, a file over a limit) is kept in ``skipped`` with
    the reason, as ``[{"name": ..., "reason": ...}]``."""

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        CANCELLED = "cancelled", "Cancelled"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches")
    name = models.CharField(max_length=255)  # the zip's name, or "12 files"
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    files_total = models.PositiveIntegerField(default=0)  # files found: documents made, and skipped
    files_skipped = models.PositiveIntegerField(default=0)
    skipped = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)  # every document finished, or cancelled

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return self.name


class Document(models.Model):
    class State(models.TextChoices):
        UPLOADED = "uploaded", "Uploaded"
        EXTRACTING = "extracting", "Extracting text"
        EMBEDDING = "embedding", "Indexing for search"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Kind(models.TextChoices):
        PDF = "pdf", "PDF"
        TEXT = "text", "Plain text"
        MARKDOWN = "markdown", "Markdown"
        DOCX = "docx", "Word document"
        EMAIL = "email", "E-mail"
        UNKNOWN = "unknown", "Unknown"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="documents")
    # An e-mail's attachments are documents of their own, children of the e-mail.
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True, related_name="children")
    shared_with = models.ManyToManyField(Group, blank=True, related_name="documents")
    batch = models.ForeignKey(Batch, on_delete=models.SET_NULL, null=True, blank=True, related_name="documents")
    title = models.CharField(max_length=255)
    filename = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.UNKNOWN)
    content_type = models.CharField(max_length=127, blank=True)
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    file = models.FileField(upload_to="documents/%Y/%m/", max_length=500)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UPLOADED)
    failure_reason = models.TextField(blank=True)
    pages_total = models.PositiveIntegerField(null=True, blank=True)
    pages_done = models.PositiveIntegerField(default=0)
    pages_needing_ocr = models.PositiveIntegerField(default=0)
    embedding_model = models.CharField(max_length=255, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # ingestion runs started (redeliveries count)
    # Set by a cancel while the document is being read; the worker checks it between steps and
    # between embedding batches, and stops with nothing of the document searchable.
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"]), models.Index(fields=["state"])]
        constraints = [
            # The same bytes uploaded twice by one owner are one document (attachments excepted:
            # the same file attached to two e-mails belongs to each).
            models.UniqueConstraint(
                fields=["owner", "sha256"],
                condition=models.Q(parent__isnull=True),
                name="document_unique_bytes_per_owner",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES


FINISHED_STATES = frozenset({Document.State.READY, Document.State.FAILED, Document.State.CANCELLED})
UNFINISHED_STATES = frozenset({Document.State.UPLOADED, Document.State.EXTRACTING, Document.State.EMBEDDING})


class Page(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pages")
    number = models.PositiveIntegerField()  # 1-based, as people count pages
    text = models.TextField()
    # Where this page's text starts in the document's text (pages joined by "\n\n"), so that a
    # quote found anywhere can be traced to its page.
    char_start = models.PositiveIntegerField(default=0)
    needs_ocr = models.BooleanField(default=False)  # an image with no text layer, OCR unavailable
    ocr = models.BooleanField(default=False)  # the text was read from the image by OCR

    class Meta:
        ordering = ["document", "number"]
        constraints = [models.UniqueConstraint(fields=["document", "number"], name="page_unique_number")]

    def __str__(self) -> str:
        return f"{self.document} p.{self.number}"


class Chunk(models.Model):
    """A passage for search: a run of tokens of the embedding model, with overlap."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    page_start = models.PositiveIntegerField()
    page_end = models.PositiveIntegerField()
    char_start = models.PositiveIntegerField()  # in the document's text, like Page.char_start
    char_end = models.PositiveIntegerField()
    text = models.TextField()
    token_count = models.PositiveIntegerField()
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True)
    embedding_model = models.CharField(max_length=255, blank=True)
    search_vector = SearchVectorField(null=True)

    class Meta:
        ordering = ["document", "index"]
        constraints = [models.UniqueConstraint(fields=["document", "index"], name="chunk_unique_index")]
        indexes = [
            HnswIndex(
                name="chunk_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            GinIndex(fields=["search_vector"], name="chunk_search_vector_gin"),
        ]

    def __str__(self) -> str:
        return f"{self.document} chunk {self.index}"
