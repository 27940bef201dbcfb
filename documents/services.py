"""Writes for documents. Views, API, admin actions and tasks call these; nothing else writes
Document, Page or Chunk.

A document moves ``uploaded -> extracting -> embedding -> ready`` (or ``failed`` with a reason a
person understands, or ``cancelled``). Extraction runs in a sandboxed child process with time and
memory limits; embedding runs in batches and reports pages done as it goes.

Cancelling: a document not started yet is cancelled at once (its queued task finds it finished
and does nothing); one being read gets ``cancel_requested``, which the worker checks after
extraction and between embedding batches, and once more under the row's lock in the transaction
that would make its passages searchable. So a cancelled document never has passages, and the
worker simply goes on with its next file.

One thread reads a document at a time: a reader takes it first and writes only while it still
holds it (``Reading``, below), so a second message for a document ends at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePath
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Sum, Value, When
from django.utils import timezone

from appliance.broker import PUBLISH_ERRORS, BrokerUnavailable, broker_check, send_unsent, unsent_if_forgotten
from documents.extraction import ExtractedDocument, ExtractionError, ExtractionLimits, page_offsets
from documents.models import UNFINISHED_STATES, Batch, Chunk, Document, Page
from documents.search import chunk_search_vector
from documents.term_counts import forget_document_terms, store_document_terms

logger = logging.getLogger(__name__)

KIND_BY_SUFFIX = {
    ".pdf": Document.Kind.PDF,
    ".txt": Document.Kind.TEXT,
    ".text": Document.Kind.TEXT,
    ".md": Document.Kind.MARKDOWN,
    ".markdown": Document.Kind.MARKDOWN,
    ".docx": Document.Kind.DOCX,
    ".eml": Document.Kind.EMAIL,
}


MAX_INGEST_ATTEMPTS = 3
# An upload or a source's poll fills its batch in well under this (a poll stops taking files at
# 10 minutes); a batch still unfilled after it lost its filler, and settles like a filled one.
BATCH_FILL_TIMEOUT_S = 3600
# A document's ingest stops after this long. The ingest worker's pool is threads, where Celery
# keeps no time limit, so the service keeps it: checked where a cancel is (after extraction,
# which has its own limit in the sandbox, and between embedding batches).
INGEST_TIME_LIMIT_S = 3600
TIME_LIMIT_REASON = "Processing this file took over an hour and was stopped."
INTERNAL_ERROR_REASON = (
    "An internal error stopped the processing of this file; the administrator can find it in the logs."
)


class UploadRejected(ValueError):
    """The upload is refused before anything is stored; the message is for the user. ``status``:
    400 (the file), 413 (a size or storage limit), 429 (too much in progress: try later)."""

    def __init__(self, message: str, *, status: int = 400, code: str = "bad-request", retry_after_s: int = 0):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


class NotAllowed(PermissionError):
    """The user may not change this document."""


class IngestCancelled(Exception):
    """The document's ingestion was cancelled while it ran (raised between steps)."""


class ReadingLost(Exception):
    """The document is no longer this reader's: it was silent past its lease and another reader
    took the document over, or the document was deleted. It stops, writing nothing more."""


class IngestTimedOut(Exception):
    """The document's ingestion ran past ``INGEST_TIME_LIMIT_S`` (raised between steps)."""


def _deadline() -> float:
    return time.monotonic() + INGEST_TIME_LIMIT_S


def _raise_if_past(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise IngestTimedOut()


def _sha256_chunks(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _new_document_fields(name: str, content_type: str, size_bytes: int, sha256: str) -> dict:
    """What a new document (upload or attachment) takes from its file's name and bytes."""
    filename = PurePath(name or "upload").name[:255] or "upload"
    return {
        "title": PurePath(filename).stem[:255] or filename,
        "filename": filename,
        "kind": KIND_BY_SUFFIX.get(PurePath(filename).suffix.lower(), Document.Kind.UNKNOWN),
        "content_type": (content_type or "")[:127],
        "size_bytes": size_bytes,
        "sha256": sha256,
    }


def max_upload_bytes() -> int:
    return settings.APPLIANCE_MAX_UPLOAD_MB * 1024 * 1024


def _check_owner_limits(owner: User, upload: UploadedFile) -> None:
    """One person's storage (``APPLIANCE_MAX_STORAGE_MB_PER_USER``, 413) and documents waiting
    to be read (``APPLIANCE_MAX_INGESTING_PER_USER``, 429): one person cannot fill the disk or
    the ingest queue for everyone."""
    quota_mb = settings.APPLIANCE_MAX_STORAGE_MB_PER_USER
    if quota_mb:
        used = Document.objects.filter(owner=owner).aggregate(total=Sum("size_bytes"))["total"] or 0
        if used + (upload.size or 0) > quota_mb * 1024 * 1024:
            raise UploadRejected(
                f"{upload.name} was not stored: your documents take {used / 1024 / 1024:.1f} MB and one person "
                f"may store {quota_mb} MB (APPLIANCE_MAX_STORAGE_MB_PER_USER). Delete documents you no longer need.",
                status=413,
                code="storage-quota",
            )
    _check_waiting(owner, upload)


def _check_waiting(owner: User, upload: UploadedFile) -> None:
    """The documents one person has waiting to be read (``APPLIANCE_MAX_INGESTING_PER_USER``)."""
    cap = settings.APPLIANCE_MAX_INGESTING_PER_USER
    if cap:
        waiting = Document.objects.filter(
            owner=owner, state__in=[Document.State.UPLOADED, Document.State.EXTRACTING, Document.State.EMBEDDING]
        ).count()
        if waiting >= cap:
            raise UploadRejected(
                f"{upload.name} was not stored: {waiting} of your documents are still being read, as many as one "
                f"person may have waiting (APPLIANCE_MAX_INGESTING_PER_USER). Try again when some are ready.",
                status=429,
                code="ingest-queue-full",
                retry_after_s=60,
            )


def document_create(
    *,
    owner: User,
    upload: UploadedFile,
    groups: Iterable[Group] = (),
    ingest_here: bool = False,
    batch: Batch | None = None,
) -> tuple[Document, bool]:
    """Store an upload and queue its ingestion. Returns (document, created): the same bytes
    uploaded again by the same owner return the existing document and do no work, unless its
    ingestion had been cancelled: then it is queued again (in ``batch``, if given).

    ``ingest_here`` ingests it in this process instead (``document_ingest``, the ingest worker's
    own code), with no broker: for measurements that need documents but no workers."""
    if upload.size is not None and upload.size > max_upload_bytes():
        raise UploadRejected(
            f"{upload.name} is {upload.size / 1024 / 1024:.1f} MB; the limit is {settings.APPLIANCE_MAX_UPLOAD_MB} MB."
        )
    if not upload.size:
        raise UploadRejected(f"{upload.name} is empty.")
    if not ingest_here:
        broker_check()  # a stored file that nothing will ingest would stay "uploaded" for ever
    sha256 = _sha256_chunks(upload.chunks())
    upload.seek(0)
    existing = Document.objects.filter(owner=owner, sha256=sha256, parent__isnull=True).first()
    if existing is not None:
        if existing.state == Document.State.CANCELLED and not ingest_here:
            _check_waiting(owner, upload)  # stored already, but it will wait to be read again
            if _requeue_cancelled(existing, batch):
                existing.refresh_from_db()
                return existing, True
        return existing, False  # a file already kept costs nothing more: no limit refuses it
    _check_owner_limits(owner, upload)
    fields = _new_document_fields(upload.name or "upload", upload.content_type or "", upload.size or 0, sha256)
    try:
        with transaction.atomic():
            document = Document.objects.create(owner=owner, file=upload, batch=batch, **fields)
            groups = list(groups)
            if groups:
                document.shared_with.set(groups)
            if not ingest_here:
                transaction.on_commit(lambda: _dispatch_upload(document))
    except IntegrityError:  # the same bytes uploaded twice at the same moment
        existing = Document.objects.filter(owner=owner, sha256=sha256, parent__isnull=True).first()
        if existing is None:
            raise
        return existing, False
    if ingest_here:
        document = document_ingest(document_id=document.pk) or document
    return document, True


def _requeue_cancelled(document: Document, batch: Batch | None) -> bool:
    """A cancelled document uploaded again is read again (compare-and-set: once)."""
    fields: dict = {
        "state": Document.State.UPLOADED,
        "cancel_requested": False,
        "attempts": 0,
        "failure_reason": "",
        "dispatched_at": None,
        "updated_at": timezone.now(),  # the watchdog's grace counts from here
    }
    if batch is not None:
        fields["batch"] = batch
    with transaction.atomic():
        if not Document.objects.filter(pk=document.pk, state=Document.State.CANCELLED).update(**fields):
            return False
        transaction.on_commit(lambda: _dispatch_upload(document))
    return True


def _dispatch_upload(document: Document) -> None:
    """Queue an upload's ingestion; if the broker went away after the check, take the upload
    back (row and file) and say so, rather than keep a document nothing will ingest (and that
    the same file uploaded again would only find)."""
    try:
        ingest_send(document.pk)
    except PUBLISH_ERRORS as exc:
        logger.warning("document %s: the broker did not take its ingestion; the upload was removed", document.pk)
        document_delete(document=document)
        raise BrokerUnavailable() from exc


def ingest_send(document_id: int) -> None:
    """Publish the document's ingestion, then record that it was (``Document.dispatched_at``).
    Raises one of ``PUBLISH_ERRORS`` when the broker does not take it."""
    from documents.tasks import ingest_document

    ingest_document.delay(document_id)
    Document.objects.filter(pk=document_id, dispatched_at=None).update(dispatched_at=timezone.now())


def _enqueue_ingest(document_id: int) -> None:
    """Send its ingestion once the transaction commits; if the broker does not take it then, the
    watchdog sends it later (``documents_dispatch_pending``)."""

    def send() -> None:
        try:
            ingest_send(document_id)
        except PUBLISH_ERRORS:
            logger.warning("document %s: the broker did not take its ingestion; the watchdog sends it", document_id)

    transaction.on_commit(send)


# A document uploaded and still unsent this long after it was stored lost its sender (its web
# process or worker died between the commit and the send): the watchdog sends it.
DISPATCH_GRACE_S = 30


def documents_dispatch_pending() -> int:
    """The ingest worker's watchdog: send what no message will read
    (``appliance.broker.send_unsent``, as the inference workers' watchdog does for jobs):
    - once, an upload whose message was never sent (its web process or worker died between the
      commit and the send);
    - a document whose reader's lease ran out mid-way (its process died, or stopped for
      minutes), or that was being read when the lease was introduced: marked as sent (no reader,
      and ``RESEND_AFTER_S`` to be taken), the next reader takes it over, and the take counts an
      attempt, so a file that kills its worker is given up after ``MAX_INGEST_ATTEMPTS``. If no
      reader has taken it by then (the message was lost, or the take failed), it is sent again:
      a message too many finds the document held and ends.
    The readings of this process are renewed first: a worker that was itself stopped for a
    while does not take its own readings for dead.
    Returns how many were sent."""
    from documents.tasks import ingest_document

    HELD_READINGS.renew()
    now = timezone.now()
    cutoff = now - timedelta(seconds=DISPATCH_GRACE_S)
    unsent = Document.objects.filter(state=Document.State.UPLOADED, dispatched_at=None, updated_at__lt=cutoff)
    sent = send_unsent(unsent, ingest_document.delay, what="document")
    abandoned = Document.objects.filter(
        Q(read_until__lt=now) | Q(read_until=None), state__in=[Document.State.EXTRACTING, Document.State.EMBEDDING]
    )
    return sent + send_unsent(
        abandoned,
        ingest_document.delay,
        what="document",
        take={"reader": None, "read_until": now + timedelta(seconds=RESEND_AFTER_S)},
        give_back={"read_until": now},
        why="its reader's lease ran out mid-way (its worker died?)",
    )


def documents_unsent_if_the_broker_forgot() -> int:
    """When the broker may have lost its queues (it came back empty or restarted:
    ``appliance.broker.forgot``), mark the message of every document that waits for a reader
    unsent, for ``documents_dispatch_pending`` to send again: an upload that waits in the queue,
    and a lapsed reading sent to be taken over; and send the re-embedding of documents embedded
    with another model again. Each would otherwise wait for ever (an upload), ``RESEND_AFTER_S``
    (a reading) or until the web node next starts (a re-embedding). Returns how many; raises one
    of ``PUBLISH_ERRORS`` while the broker does not answer."""
    from documents.embeddings import model_path as embedding_model_path

    def mark_unsent() -> int:
        now = timezone.now()
        waiting = Document.objects.filter(state=Document.State.UPLOADED).exclude(dispatched_at=None)
        handed_on = Document.objects.filter(
            state__in=[Document.State.EXTRACTING, Document.State.EMBEDDING], reader=None, read_until__gt=now
        )
        lost = waiting.update(dispatched_at=None) + handed_on.update(read_until=now)
        return lost + document_reembed_stale(model_name=embedding_model_path()[1])  # sent now: they record no send

    return unsent_if_forgotten("documents", mark_unsent)


# A lapsed reading sent again and not taken within this long is sent once more.
RESEND_AFTER_S = 600


def document_fail(reading: Reading, *, reason: str) -> Document | None:
    """Failed by its reader, with a reason for a person (nothing, if it is no longer its own)."""
    reading.end(Document.State.FAILED, failure_reason=reason)
    document = _current(reading.document_id)
    if document is not None:
        batch_settle(batch_id=document.batch_id)
    return document


def document_cancel(*, document: Document, user: User) -> bool:
    """Cancel the ingestion of a document (and of its attachments): at once if it has not
    started, at the worker's next check if it is being read. Owner only. Returns False when
    there was nothing to cancel (it had finished)."""
    if document.owner_id != user.pk:
        raise NotAllowed("Only the owner can cancel the reading of a document.")
    ids = [each.pk for each in _document_tree(document)]
    with transaction.atomic():
        waiting = Document.objects.filter(pk__in=ids, state=Document.State.UPLOADED).update(
            state=Document.State.CANCELLED, cancel_requested=False, failure_reason=""
        )
        running = Document.objects.filter(
            pk__in=ids, state__in=[Document.State.EXTRACTING, Document.State.EMBEDDING], cancel_requested=False
        ).update(cancel_requested=True)
    batch_settle(batch_id=document.batch_id)
    return bool(waiting or running)


def _document_cancelled(reading: Reading) -> Document | None:
    """The worker stopped a cancelled document: nothing of it is kept but the stored file (so
    the same file uploaded again is read again)."""
    document_id = reading.document_id
    with transaction.atomic():
        try:
            document = reading.lock()
        except ReadingLost:  # deleted, or another reader has it now
            return _current(document_id)
        _passages_delete(document)
        Page.objects.filter(document=document).delete()
        for child in document.children.all():  # attachments found before the cancel
            document_delete(document=child)
        reading.end(
            Document.State.CANCELLED,
            cancel_requested=False,
            pages_done=0,
            pages_total=None,
            pages_needing_ocr=0,
            failure_reason="",
        )
    batch_settle(batch_id=document.batch_id)
    return _current(document_id)


def batch_settle(*, batch_id: int | None, filled: bool = False) -> None:
    """A batch whose documents have all finished is finished (or stays cancelled), with the time.
    A batch still being filled (its ``files_total`` is counted when the upload or the poll that
    fills it is done, 0 until then) is not settled by a worker that finished the documents made
    so far: its filler settles it, ``filled=True``. One whose filler died (a web process gone
    in the middle of an upload) counts as filled after ``BATCH_FILL_TIMEOUT_S``."""
    if batch_id is None:
        return
    unfinished = Document.objects.filter(batch_id=OuterRef("pk"), state__in=UNFINISHED_STATES)
    settled = Batch.objects.filter(pk=batch_id, finished_at__isnull=True).exclude(Exists(unfinished))
    if not filled:
        stale = timezone.now() - timedelta(seconds=BATCH_FILL_TIMEOUT_S)
        settled = settled.filter(Q(files_total__gt=0) | Q(created_at__lt=stale))
    # One statement: as two (the state, then the time), a settle that found another document
    # still unfinished for the first and finished for the second (it committed in between) left
    # a running batch with its end time, which no later settle would touch.
    settled.update(
        state=Case(When(state=Batch.State.RUNNING, then=Value(Batch.State.FINISHED)), default=F("state")),
        finished_at=timezone.now(),
    )


MESSAGE_UPLOAD_MAX_BYTES = 5 * 1024 * 1024
MESSAGE_UPLOAD_MAX_PAGES = 10


MESSAGE_READING_TIMEOUT_S = 30.0


def text_of_message_upload(upload, *, owner_id: int | None = None) -> str:
    """The text of an incoming letter or e-mail uploaded to reply to (PDF, Word, text, .eml),
    extracted in the sandbox like any document, but not stored: it is the job's input. It is
    read in the web process's request, so one person's are read one at a time (``owner_id``):
    a sandbox may take its time limit and ``APPLIANCE_EXTRACTION_MEMORY_MB``, and a few
    requests sent at once would otherwise hold every thread of the web server and that much
    memory each. A second while one is read is refused (429) and loses nothing."""
    if upload.size > MESSAGE_UPLOAD_MAX_BYTES:
        raise UploadRejected(
            f"{upload.name}: a message to reply to can be at most {MESSAGE_UPLOAD_MAX_BYTES // (1024 * 1024)} MB."
        )
    if owner_id is None:
        return _read_message_upload(upload)
    with _one_reading_at_a_time(owner_id, upload.name):
        return _read_message_upload(upload)


@contextmanager
def _one_reading_at_a_time(owner_id: int, name: str) -> Iterator[None]:
    """Holds the person's turn (a Valkey key, for at most the sandbox's time limit and a margin,
    so a web process that died holding it frees it); lets the reading through if the broker is
    unreachable, as the rate limits do (the job then fails to queue with its own message)."""
    from inference.streaming import delete_if_holds, sync_client

    client, key, token = sync_client(), f"appliance:message-reading:{owner_id}", secrets.token_hex(8)
    try:
        taken = client.set(key, token, nx=True, ex=int(MESSAGE_READING_TIMEOUT_S) + 30)
    except redis.RedisError:
        logger.warning("message upload: the broker is unreachable; user %s's reading not held", owner_id)
        yield
        return
    if not taken:
        left_ms = 0  # the turn's time left (the key's), for Retry-After
        with suppress(redis.RedisError):
            left_ms = int(client.pttl(key))
        raise UploadRejected(
            f"{name}: another message file of yours is being read; send this one again when it is done.",
            status=429,
            code="reading-in-progress",
            retry_after_s=max(1, math.ceil(left_ms / 1000)) if left_ms > 0 else 1,
        )
    try:
        yield
    finally:
        with suppress(redis.RedisError):
            delete_if_holds(key, token)  # a turn that outlived its time is another's


def _read_message_upload(upload) -> str:
    from documents.sandbox import SandboxLimits, extract_in_sandbox

    data = b"".join(upload.chunks())
    try:
        extracted = extract_in_sandbox(
            data,
            filename=upload.name,
            content_type=getattr(upload, "content_type", "") or "",
            limits=ExtractionLimits(max_pages=MESSAGE_UPLOAD_MAX_PAGES, max_chars=200_000, max_attachments=0),
            sandbox=SandboxLimits(
                timeout_s=min(MESSAGE_READING_TIMEOUT_S, settings.APPLIANCE_EXTRACTION_TIMEOUT_S),
                memory_bytes=settings.APPLIANCE_EXTRACTION_MEMORY_MB * 1024 * 1024,
            ),
            use_ocr=settings.APPLIANCE_OCR,
        )
    except ExtractionError as exc:
        raise UploadRejected(f"{upload.name}: {exc}") from None
    text = "\n\n".join(page.text for page in extracted.pages if page.text.strip()).strip()
    if not text:
        raise UploadRejected(f"{upload.name}: no text could be read from this file.")
    return text


# --- reading: one thread at a time per document ------------------------------------------------
#
# A document can get a second message: a send that worked but was not recorded, a cancelled
# document uploaded again while its first message still waited, the watchdog resending one whose
# reader died. So a reader first takes the document (compare-and-set on ``Document.reader``) and
# holds it on a lease that its process renews every ``READ_RENEW_S`` while it reads (one thread
# for all the process's readings: a reader waiting on the embedder or the sandbox stays alive);
# a message that finds it held ends at once. Everything a reader writes is conditional on its
# token (``Reading``), so one whose process stopped renewing and was replaced writes nothing more.

READ_LEASE_S = 120  # a reading not renewed for this long is its dead process's
READ_RENEW_S = 20  # so a process misses five renewals before it loses its readings


def _lease_end():
    return timezone.now() + timedelta(seconds=READ_LEASE_S)


def _unheld() -> Q:
    """No reader holds the document: none took it, or the one that did is past its lease."""
    return Q(reader=None) | Q(read_until__lt=timezone.now())


def _current(document_id: int) -> Document | None:
    return Document.objects.filter(pk=document_id).first()


class _HeldReadings:
    """The readings this process holds, renewed together by one thread (started with the
    first) every ``READ_RENEW_S``. A reading older than the ingest's time limit (and a lease) is
    no longer renewed: a reader stuck past its limit (a hung wait) lets its document go."""

    def __init__(self) -> None:
        self._taken: dict[uuid.UUID, float] = {}  # token -> when it was taken (monotonic)
        self._lock = threading.Lock()
        self._renewing = False

    def add(self, token: uuid.UUID) -> None:
        from appliance.celery import Watchdog

        with self._lock:
            if not self._renewing:
                Watchdog("document-readings", self.renew).start(READ_RENEW_S)
                self._renewing = True
            self._taken[token] = time.monotonic()

    def discard(self, token: uuid.UUID) -> None:
        with self._lock:
            self._taken.pop(token, None)

    def renew(self) -> int:
        """Extend the lease of every reading held here; how many are still this process's.
        Rows locked by their reader's own transaction are skipped (it is alive, and waiting for
        it could deadlock with a reader that locks an e-mail and its attachment)."""
        oldest = time.monotonic() - INGEST_TIME_LIMIT_S - READ_LEASE_S
        with self._lock:
            tokens = [token for token, taken in self._taken.items() if taken > oldest]
        if not tokens:
            return 0
        with transaction.atomic():
            free = Document.objects.select_for_update(skip_locked=True).filter(reader__in=tokens).order_by("pk")
            ids = list(free.values_list("pk", flat=True))
            return Document.objects.filter(pk__in=ids, reader__in=tokens).update(read_until=_lease_end())


HELD_READINGS = _HeldReadings()


@dataclass(frozen=True)
class Reading:
    """A reader's hold on its document: every write it makes goes through here."""

    document_id: int
    token: uuid.UUID

    @classmethod
    @contextmanager
    def taken(cls, document_id: int, *, states: Iterable[str], **fields) -> Iterator[Reading | None]:
        """Hold the document while the block runs, if it is in one of ``states`` and no reader
        holds it, writing ``fields`` in the same update (None when it is finished, gone or read
        by another). Its lease is renewed until the block ends."""
        token = uuid.uuid4()
        taken = Document.objects.filter(_unheld(), pk=document_id, state__in=list(states)).update(
            reader=token, read_until=_lease_end(), **fields
        )
        if not taken:
            yield None
            return
        try:
            HELD_READINGS.add(token)
            yield cls(document_id, token)
        finally:
            HELD_READINGS.discard(token)

    def rows(self):
        return Document.objects.filter(pk=self.document_id, reader=self.token)

    def write(self, *, unless_cancelled: bool = False, **fields) -> None:
        """Write ``fields``. Raises ``IngestCancelled`` (with ``unless_cancelled``, when a
        cancel was asked) or ``ReadingLost``, writing nothing."""
        rows = self.rows().filter(cancel_requested=False) if unless_cancelled else self.rows()
        if rows.update(**fields) if fields else rows.exists():
            return
        if unless_cancelled and self.rows().exists():
            raise IngestCancelled()
        raise ReadingLost()

    def lock(self) -> Document:
        """The document's row, locked for the transaction, while it is still this reader's."""
        document = self.rows().select_for_update().first()
        if document is None:
            raise ReadingLost()
        return document

    def end(self, state: str, **fields) -> bool:
        """Let go of the document in ``state``; False (nothing written) if it was not ours."""
        return bool(self.rows().update(state=state, reader=None, read_until=None, **fields))


def document_ingest(*, document_id: int) -> Document | None:
    """Extract, store pages, then embed. Idempotent: a finished document is left alone, one
    interrupted mid-way starts again, one another thread is reading is left to it. Returns None
    when the document is gone."""
    with Reading.taken(
        document_id,
        states=UNFINISHED_STATES,
        attempts=F("attempts") + 1,
        state=Document.State.EXTRACTING,
        pages_done=0,
        failure_reason="",
    ) as reading:
        if reading is None:  # finished (a cancelled document's queued task ends here), gone, or being read
            return _current(document_id)
        try:
            document = Document.objects.get(pk=document_id)
            if document.cancel_requested:
                raise IngestCancelled()
            if document.attempts > MAX_INGEST_ATTEMPTS:
                # Taken again and again after its reader's worker died on it (memory, a hard limit).
                reason = f"Processing this file stopped the worker {document.attempts - 1} times; it was given up."
                return document_fail(reading, reason=reason)
            return _ingest(document, reading, _deadline())
        except Exception as exc:
            return _reading_stopped(reading, exc)


def _reading_stopped(reading: Reading, exc: Exception, *, reembedding: bool = False) -> Document | None:
    """How a reading that raised ends: cancelled, lost to another reader or a delete (nothing
    written), timed out, or failed with a reason a person understands (the error is logged). A
    re-embedding that fails leaves the document ready, with its old passages."""
    document_id = reading.document_id
    if isinstance(exc, ReadingLost | Document.DoesNotExist):
        logger.warning("document %s: no longer this reader's (deleted, or taken over after a silence)", document_id)
        return _current(document_id)
    if reembedding:
        logger.error("document %s: re-embedding failed; its old passages stay", document_id, exc_info=exc)
        reading.end(Document.State.READY)
        return _current(document_id)
    if isinstance(exc, IngestCancelled):
        return _document_cancelled(reading)
    if isinstance(exc, IngestTimedOut | SoftTimeLimitExceeded):
        return document_fail(reading, reason=TIME_LIMIT_REASON)
    logger.error("document %s: processing failed", document_id, exc_info=exc)
    return document_fail(reading, reason=INTERNAL_ERROR_REASON)


def _ingest(document: Document, reading: Reading, deadline: float) -> Document | None:
    from documents.sandbox import SandboxLimits, extract_in_sandbox

    try:
        with document.file.open("rb") as handle:
            data = handle.read(max_upload_bytes() + 1)
        if len(data) > max_upload_bytes():
            raise ExtractionError(f"The file is over the {settings.APPLIANCE_MAX_UPLOAD_MB} MB limit.")
        extracted = extract_in_sandbox(
            data,
            filename=document.filename,
            content_type=document.content_type,
            limits=ExtractionLimits(max_pages=settings.APPLIANCE_MAX_PAGES),
            sandbox=SandboxLimits(
                timeout_s=settings.APPLIANCE_EXTRACTION_TIMEOUT_S,
                memory_bytes=settings.APPLIANCE_EXTRACTION_MEMORY_MB * 1024 * 1024,
            ),
            use_ocr=settings.APPLIANCE_OCR,
        )
    except ExtractionError as exc:
        return document_fail(reading, reason=str(exc))
    except OSError as exc:
        logger.warning("document %s: stored file unreadable: %s", document.pk, exc)
        reason = "The stored file could not be read. Upload it again."
        return document_fail(reading, reason=reason)

    reading.write(unless_cancelled=True)
    _raise_if_past(deadline)
    _store_pages(document, extracted, reading)
    document.refresh_from_db()
    if not any(page.text.strip() for page in extracted.pages) and not extracted.attachments:
        return document_fail(reading, reason=no_text_reason(len(extracted.pages)))
    return _embed(document, reading, deadline)


def no_text_reason(pages: int) -> str:
    if not settings.APPLIANCE_OCR:
        why = "OCR is turned off on this appliance (APPLIANCE_OCR)"
    else:
        from documents.ocr import default_ocr_engine

        why = (
            "OCR could not read them"
            if default_ocr_engine() is not None
            else "OCR is not installed on this appliance (Debian packages tesseract-ocr and poppler-utils)"
        )
    return f"No text could be found: the {pages} page(s) are images (scans) with no text layer, and {why}."


def _store_pages(document: Document, extracted: ExtractedDocument, reading: Reading) -> None:
    texts = [page.text for page in extracted.pages]
    offsets = page_offsets(texts)
    with transaction.atomic():  # rolled back by ReadingLost at the write below
        Page.objects.filter(document=document).delete()
        _passages_delete(document)
        for child in document.children.all():  # from an earlier, interrupted run
            document_delete(document=child)
        Page.objects.bulk_create(
            [
                Page(
                    document=document,
                    number=number,
                    text=page.text,
                    char_start=offset,
                    needs_ocr=page.needs_ocr,
                    ocr=page.ocr,
                )
                for number, (page, offset) in enumerate(zip(extracted.pages, offsets, strict=True), 1)
            ],
            batch_size=500,
        )
        updates: dict[str, Any] = {
            "kind": extracted.kind,
            "pages_total": len(extracted.pages),
            "pages_done": 0,
            "pages_needing_ocr": sum(1 for page in extracted.pages if page.needs_ocr),
        }
        if extracted.title:
            updates["title"] = extracted.title[:255]
        kept, refused = _attachments_allowed(document, len(extracted.attachments))
        if refused:
            updates["failure_reason"] = refused
        reading.write(**updates)  # after the upload's lock, if any, as a cancel takes them
        for attachment in extracted.attachments[:kept]:
            _create_child(document, attachment)


def _attachments_allowed(document: Document, found: int) -> tuple[int, str]:
    """How many of the ``found`` attachments of ``document`` become documents, and why the rest
    do not (""): attachments nested deeper than ``APPLIANCE_MAX_ATTACHMENT_DEPTH`` (an e-mail's
    own are at depth 1), and more than ``APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD`` under one upload
    in all, are not kept (a nested e-mail of 50 x 50 x 50 attachments would be 127,550
    documents). Takes the upload's row lock, so that two of its e-mails read at once count
    each other's (call inside a transaction)."""
    if not found:
        return 0, ""
    lineage = _lineage(document)
    root, depth = lineage[-1], len(lineage)
    Document.objects.select_for_update().filter(pk=root.pk).first()  # the upload's alone: one lock order
    max_depth = settings.APPLIANCE_MAX_ATTACHMENT_DEPTH
    if depth > max_depth:
        return 0, (
            f"Its {found} attachment(s) were not kept: they are nested {depth} levels deep, and attachments "
            f"are kept to {max_depth} level(s) (APPLIANCE_MAX_ATTACHMENT_DEPTH)."
        )
    limit = settings.APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD
    existing = len(_document_tree(root)) - 1
    kept = max(0, min(found, limit - existing))
    if kept == found:
        return found, ""
    return kept, (
        f"{found - kept} of its {found} attachment(s) were not kept: one upload keeps at most {limit} attachments "
        f"in all (APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD)."
    )


def _lineage(document: Document) -> list[Document]:
    """``document``, the e-mail it is attached to, the one that is attached to, ... up to the
    upload (or the document taken from a source), which is last."""
    lineage = [document]
    while lineage[-1].parent_id is not None:
        lineage.append(Document.objects.get(pk=lineage[-1].parent_id))
    return lineage


def _create_child(parent: Document, attachment) -> Document:
    """An e-mail attachment becomes a document of its own, owned and shared like its e-mail."""
    fields = _new_document_fields(
        attachment.filename or "attachment",
        attachment.content_type,
        len(attachment.data),
        hashlib.sha256(attachment.data).hexdigest(),
    )
    child = Document(owner=parent.owner, parent=parent, **fields)
    child.file.save(fields["filename"], ContentFile(attachment.data), save=False)
    child.save()
    child.shared_with.set(parent.shared_with.all())
    _enqueue_ingest(child.pk)
    return child


def chunk_rows(document: Document, spans, vectors, model_name: str) -> list[Chunk]:
    """Unsaved Chunk rows for chunk spans and their embeddings (in the same order)."""
    return [
        Chunk(
            document=document,
            index=span.index,
            page_start=span.page_start,
            page_end=span.page_end,
            char_start=span.char_start,
            char_end=span.char_end,
            text=span.text,
            token_count=span.token_count,
            embedding=[float(x) for x in vector],
            embedding_model=model_name,
        )
        for span, vector in zip(spans, vectors, strict=True)
    ]


def document_embed(*, document_id: int) -> Document | None:
    """Chunk the stored pages with the embedding model's tokenizer, embed in batches, then swap
    the new chunks in at once. Also how a ready document is re-embedded after the embedding
    model changes: it stays ready and searchable (with its old chunks) until the swap. Only a
    ready document no reader holds is re-embedded; if re-embedding fails, it stays as it was."""
    with Reading.taken(document_id, states=[Document.State.READY]) as reading:
        if reading is None:
            return _current(document_id)
        try:
            return _embed(Document.objects.get(pk=document_id), reading, _deadline())
        except Exception as exc:
            return _reading_stopped(reading, exc, reembedding=True)


def _embed(document: Document, reading: Reading, deadline: float) -> Document | None:
    """Passages of the stored pages, embedded through the process's batcher: a piece of
    ``APPLIANCE_EMBEDDING_BATCH`` passages at a time, which the batcher embeds together with
    other documents' pieces (``documents.embedding_batcher``), reporting pages done after each."""
    from documents.chunking import chunk_pages, document_text, embedding_text
    from documents.embeddings import chunking_tokenizer, headings_for, passage_batcher, passage_embedder

    reembedding = document.state == Document.State.READY
    embedder = passage_embedder()
    batcher = passage_batcher()
    pages = list(Page.objects.filter(document=document).order_by("number").values_list("number", "char_start", "text"))
    spans = chunk_pages(
        pages,
        tokenizer=chunking_tokenizer(embedder),
        max_tokens=settings.APPLIANCE_CHUNK_TOKENS,
        overlap_tokens=settings.APPLIANCE_CHUNK_OVERLAP_TOKENS,
    )
    headings = headings_for(embedder, document_text(pages), spans)
    if not reembedding:
        reading.write(state=Document.State.EMBEDDING, pages_done=0)
    chunks: list[Chunk] = []
    piece = batcher.batch_size
    for start in range(0, len(spans), piece):
        _raise_if_past(deadline)
        batch = spans[start : start + piece]
        vectors = batcher.embed([embedding_text(span.text, headings[span.index]) for span in batch])
        chunks.extend(chunk_rows(document, batch, vectors, embedder.model_name))
        if not reembedding:  # pages before the last one this batch reached are done; a cancel stops here
            reading.write(unless_cancelled=True, pages_done=max(0, batch[-1].page_end - 1))
    with transaction.atomic():
        # Under the row's lock: a cancel that comes now waits for this transaction and then finds
        # the document ready; one that came before stops it with no passage stored.
        if reading.lock().cancel_requested and not reembedding:
            raise IngestCancelled()
        passages_store(document=document, chunks=chunks)
        reading.end(Document.State.READY, pages_done=len(pages), embedding_model=embedder.model_name, attempts=0)
    if not reembedding:
        batch_settle(batch_id=document.batch_id)
    return Document.objects.get(pk=document.pk)


def passages_store(*, document: Document, chunks: list[Chunk]) -> None:
    """Replace the document's passages with ``chunks`` (unsaved): stored, indexed for words
    (``search.chunk_search_vector``) and their terms counted for the words arm's weights
    (``term_counts``), all in one transaction, so that search sees all of it or none."""
    with transaction.atomic():
        Chunk.objects.filter(document=document).delete()
        Chunk.objects.bulk_create(chunks, batch_size=500)
        Chunk.objects.filter(document=document).update(search_vector=chunk_search_vector())
        store_document_terms(document.pk)


def _passages_delete(document: Document) -> None:
    Chunk.objects.filter(document=document).delete()
    forget_document_terms(document.pk)


def documents_needing_reembedding(model_name: str):
    return Document.objects.filter(state=Document.State.READY).exclude(embedding_model=model_name)


def document_reembed_stale(*, model_name: str) -> int:
    """Queue re-embedding of every ready document embedded with another model. Returns how many."""
    from documents.tasks import embed_document

    ids = list(documents_needing_reembedding(model_name).values_list("pk", flat=True))
    for document_id in ids:
        embed_document.delay(document_id)
    return len(ids)


def document_share(*, document: Document, user: User, groups: Iterable[Group]) -> None:
    """Share with exactly these groups (an empty list makes it private). Owner only; the user
    must belong to every group named. Attachments follow their e-mail."""
    if document.owner_id != user.pk:
        raise NotAllowed("Only the owner can change who a document is shared with.")
    groups = list(groups)
    mine = set(user.groups.values_list("pk", flat=True))
    if any(group.pk not in mine for group in groups):
        raise NotAllowed("You can only share with groups you belong to.")
    with transaction.atomic():
        # The upload's row lock, which the worker holds while it makes an e-mail's attachments
        # (``_attachments_allowed``): an attachment made meanwhile is either in the tree below or
        # takes the e-mail's shares as they are after this (without it, one made while its
        # e-mail was made private kept the old groups).
        Document.objects.select_for_update().filter(pk=_lineage(document)[-1].pk).first()
        for each in _document_tree(document):  # attachments, and theirs, follow their e-mail
            each.shared_with.set(groups)


def _document_tree(document: Document) -> list[Document]:
    """The document, its attachments, and theirs (an e-mail attached to an e-mail)."""
    tree, pending = [], [document]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(current.children.all())
    return tree


def document_delete(*, document: Document, user: User | None = None) -> None:
    """Delete a document with its pages, chunks, attachments and stored files."""
    if user is not None and document.owner_id != user.pk:
        raise NotAllowed("Only the owner can delete a document.")
    files = [(each.file.storage, each.file.name) for each in _document_tree(document)]
    with transaction.atomic():
        document.delete()

        def remove_files() -> None:
            for storage, name in files:
                if name:
                    storage.delete(name)

        transaction.on_commit(remove_files)
