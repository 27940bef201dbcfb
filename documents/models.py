from __future__ import annotations

import re
import uuid
from pathlib import Path, PurePath, PurePosixPath

from django.conf import settings
from django.contrib.auth.models import Group
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
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


class Source(models.Model):
    """A place documents arrive from by themselves: a watched folder (a local path or a mounted
    share) or an IMAP mailbox, configured by an administrator with the owner and groups its
    documents get. Polled by Celery beat (``documents.source_services.source_poll``); what each
    poll found, and why one failed, is kept here for the admin console.

    A mailbox's password is never stored here: ``imap_password_file`` names a file the workers
    read it from (``*_FILE`` style, e.g. a systemd credential or a mounted secret)."""

    class Kind(models.TextChoices):
        FOLDER = "folder", "Watched folder"
        IMAP = "imap", "IMAP mailbox"

    class Tls(models.TextChoices):
        IMPLICIT = "implicit", "TLS from the start (IMAPS, port 993)"
        STARTTLS = "starttls", "STARTTLS (port 143)"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,  # its documents are theirs: delete the source first
        related_name="sources",
        help_text="The person whose documents the files and messages become.",
    )
    groups = models.ManyToManyField(
        Group, blank=True, related_name="sources", help_text="The groups its documents are shared with."
    )
    poll_interval_s = models.PositiveIntegerField(
        default=300, help_text="Seconds between polls (at least 30; beat looks for due sources every minute)."
    )
    # A watched folder.
    folder_path = models.CharField(
        max_length=1000, blank=True, help_text="An absolute path on the machine that runs the ingest workers."
    )
    include_patterns = models.CharField(
        max_length=500,
        blank=True,
        help_text="Only files matching one of these patterns, separated by spaces (e.g. “*.pdf contracts/*”); "
        "empty: every kind of document the appliance reads.",
    )
    # An IMAP mailbox.
    imap_host = models.CharField(max_length=255, blank=True)
    imap_port = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: 993 (TLS) or 143 (STARTTLS).")
    imap_tls = models.CharField(max_length=8, choices=Tls.choices, default=Tls.IMPLICIT)
    imap_ca_file = models.CharField(
        max_length=1000,
        blank=True,
        help_text="A CA certificate file for a server with a private CA; empty: the system's.",
    )
    imap_username = models.CharField(max_length=255, blank=True)
    imap_password_file = models.CharField(
        max_length=1000, blank=True, help_text="The path of a file holding the password (never stored here)."
    )
    imap_mailbox = models.CharField(max_length=255, default="INBOX", blank=True)
    # Where the mailbox's reading stands: UIDs are only meaningful within one UIDVALIDITY.
    imap_uidvalidity = models.BigIntegerField(null=True, blank=True)
    imap_last_uid = models.BigIntegerField(default=0)
    # What the last polls did, for the admin console.
    poll_started_at = models.DateTimeField(null=True, blank=True)  # a poll holds the source while set
    last_polled_at = models.DateTimeField(null=True, blank=True)  # the last poll that finished, well or not
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_result = models.CharField(max_length=500, blank=True)  # "3 new, 1 changed, 2 removed"
    last_error = models.TextField(blank=True)  # why the last poll failed, for a person; "" when it did not
    # The last poll left files or messages for later (its limit, its time, the owner's queue full,
    # files still being copied): the source is polled again at beat's next tick, not after its
    # interval, so that a backlog is taken at the pace the workers read it.
    backlog = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """What the admin form refuses: a source that could never be polled."""
        errors: dict[str, str] = {}
        var_dir = Path(settings.VAR_DIR).resolve()

        def near_var_dir(path: str, *, or_above: bool = False) -> bool:
            # The appliance's own data (database, secrets, uploads) is no source, and no file
            # whose first line may be sent to a mail server as a password.
            resolved = Path(path).resolve()
            return resolved.is_relative_to(var_dir) or (or_above and var_dir.is_relative_to(resolved))

        if self.poll_interval_s < MIN_POLL_INTERVAL_S:
            errors["poll_interval_s"] = f"Poll at most every {MIN_POLL_INTERVAL_S} seconds."
        if self.kind == self.Kind.FOLDER:
            if not PurePosixPath(self.folder_path).is_absolute():
                errors["folder_path"] = "Give the folder's absolute path, e.g. /srv/shares/contracts."
            elif near_var_dir(self.folder_path, or_above=True):
                errors["folder_path"] = f"The folder may not hold the appliance's own data ({var_dir})."
        elif self.kind == self.Kind.IMAP:
            for field in ("imap_host", "imap_username"):
                if not getattr(self, field).strip():
                    errors[field] = "A mailbox needs this."
            if not PurePosixPath(self.imap_password_file).is_absolute():
                errors["imap_password_file"] = (
                    "Give the absolute path of a file holding the password (readable by the ingest workers)."  # noqa: S105 - a message, not a password
                )
            elif near_var_dir(self.imap_password_file):
                errors["imap_password_file"] = f"The password file may not be in the appliance's own data ({var_dir})."
            if self.imap_ca_file and not PurePosixPath(self.imap_ca_file).is_absolute():
                errors["imap_ca_file"] = "Give the CA file's absolute path, or leave it empty."
        if errors:
            raise ValidationError(errors)

    @property
    def imap_port_or_default(self) -> int:
        return self.imap_port or (993 if self.imap_tls == self.Tls.IMPLICIT else 143)


MIN_POLL_INTERVAL_S = 30


class SourceItem(models.Model):
    """One file of a folder (by its path) or one message of a mailbox (by UIDVALIDITY and UID),
    as the last poll saw it: how polls tell new, changed and removed apart, and which document it
    became. A file is read again only when its size or modification time changes, and becomes a
    new document only when its bytes do (content hash)."""

    class State(models.TextChoices):
        PRESENT = "present", "Present"
        MISSING = "missing", "Removed from the source"
        FAILED = "failed", "Could not be taken"  # read again when it changes

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="items")
    key = models.CharField(max_length=1000)  # the path inside the folder, or "<uidvalidity>:<uid>"
    document = models.ForeignKey("Document", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    state = models.CharField(max_length=8, choices=State.choices, default=State.PRESENT)
    size_bytes = models.BigIntegerField(default=0)
    mtime_ns = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "key"], name="source_item_unique_key")]

    def __str__(self) -> str:
        return f"{self.source}: {self.key}"


_PLAIN_SUFFIX = re.compile(r"\.[a-z0-9]{1,10}")


def stored_file_name(instance: models.Model, filename: str) -> str:
    """Where a document's file is kept: a random name in the month's folder, with the upload's
    suffix when it is a plain one. The name a person gave is ``Document.filename``, shown and
    downloaded as given; as the name on disk it failed past the file system's 255 bytes (100
    Chinese characters are 300) and Django refused one with no letter or digit ("€.pdf")."""
    suffix = PurePath(filename).suffix.lower()
    return f"documents/{timezone.now():%Y/%m}/{uuid.uuid4().hex}{suffix if _PLAIN_SUFFIX.fullmatch(suffix) else ''}"


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
    file = models.FileField(upload_to=stored_file_name, max_length=500)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UPLOADED)
    failure_reason = models.TextField(blank=True)
    pages_total = models.PositiveIntegerField(null=True, blank=True)
    pages_done = models.PositiveIntegerField(default=0)
    pages_needing_ocr = models.PositiveIntegerField(default=0)
    embedding_model = models.CharField(max_length=255, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)  # ingestion runs started (redeliveries count)
    # Where it came from when a source brought it: the source, and the file's path in the folder
    # or the message's place in the mailbox. ``source_removed_at``: the file was deleted from the
    # folder (the document stays, marked); ``replaced_by``: the file changed, and its new bytes
    # are that document (this one stays for what cites it, out of search and the library list).
    source = models.ForeignKey(Source, on_delete=models.SET_NULL, null=True, blank=True, related_name="documents")
    source_path = models.CharField(max_length=1000, blank=True)
    source_removed_at = models.DateTimeField(null=True, blank=True)
    replaced_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="earlier_versions"
    )
    # Set by a cancel while the document is being read; the worker checks it between steps and
    # between embedding batches, and stops with nothing of the document searchable.
    cancel_requested = models.BooleanField(default=False)
    # When its ingestion's message was handed to the broker; None while it waits to be sent. A
    # document left uploaded and unsent (its web process or worker died between the commit and
    # the send) is sent by the ingest worker's watchdog (``services.documents_dispatch_pending``).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # The one reading in progress (``services.Reading``): its token and how long it holds the
    # document without a sign of life. Another message for the document finds it held and ends;
    # a reader silent past ``read_until`` (its worker died) is replaced, and whatever it writes
    # after that is refused, so a document is read by one thread at a time.
    reader = models.UUIDField(null=True, blank=True)
    read_until = models.DateTimeField(null=True, blank=True)
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


class DocumentTerm(models.Model):
    """How many passages of a document hold a term: a lexeme of their ``Chunk.search_vector``,
    as Postgres normalised it (``documents.term_counts``). The words arm of search weighs a
    query's terms by how rare they are among the passages searched; with these rows that is one
    indexed query for all of them, instead of one full-text count per term. Written with the
    document's passages, removed with them; the row whose term is empty counts the passages."""

    # Keyed by term first: search reads a term's rows over many documents. (Keyed by document
    # first, Postgres walked that key for each term, all the documents' rows: 240 ms for a
    # letter's terms over 5,000 documents, against 30 ms.)
    pk = models.CompositePrimaryKey("term", "document")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="+")
    term = models.TextField()
    passages = models.PositiveIntegerField()

    class Meta:
        # The same key with the count, so that the sums are read from the index alone.
        indexes = [models.Index(fields=["term", "document"], include=["passages"], name="document_term_by_term")]

    def __str__(self) -> str:
        return f"{self.document_id} {self.term!r}: {self.passages}"
