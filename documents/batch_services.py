"""Writes for batches: files uploaded together (several at once, or a zip of a folder) become a
``Batch`` a person can follow, and cancel.

Each file of a batch is stored and queued exactly as a single upload is (``document_create``:
the same size and storage limits, the same owner and groups, the same content checks in the
extraction sandbox), so a hostile file fails alone. A zip is opened by ``documents.archives``
(member count, unpacked size and compression ratio limits, unsafe names, nested archives);
whatever does not become a document is listed in the batch as skipped, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import PurePath

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from django.db import transaction
from django.db.models import Q

from appliance.broker import BrokerUnavailable, broker_check
from documents.archives import DOCUMENT_SUFFIXES, ArchiveLimits, ArchiveRefused, Member, looks_like_zip, read_zip
from documents.models import Batch, Document
from documents.services import NotAllowed, UploadRejected, batch_settle, document_create, max_upload_bytes

logger = logging.getLogger(__name__)

MAX_SKIPPED_LISTED = 5000  # a zip of 1,000 files lists at most that many; the cap only bounds the row


def archive_limits() -> ArchiveLimits:
    return ArchiveLimits(
        max_members=settings.APPLIANCE_BATCH_ZIP_MAX_FILES,
        max_total_bytes=settings.APPLIANCE_BATCH_ZIP_MAX_UNPACKED_MB * 1024 * 1024,
        max_member_bytes=max_upload_bytes(),
    )


def is_archive(upload: UploadedFile) -> bool:
    """A zip to unpack: named ``.zip``, or zip bytes under a name that is not a document's (a
    Word ``.docx`` is a zip too, and is a document)."""
    suffix = PurePath(upload.name or "").suffix.lower()
    if suffix == ".zip":
        return True
    if suffix in DOCUMENT_SUFFIXES:
        return False
    head = upload.read(4)
    upload.seek(0)
    return looks_like_zip(head)


class _Collector:
    """What a batch found: documents made, and the files skipped with their reasons."""

    def __init__(self, *, owner: User, batch: Batch, groups: list[Group]) -> None:
        self.owner, self.batch, self.groups = owner, batch, groups
        self.created: list[Document] = []
        self.skipped: list[dict] = []
        self.files = 0
        self.broker_down: BrokerUnavailable | None = None

    def skip(self, name: str, reason: str, **extra) -> None:
        self.files += 1
        if len(self.skipped) < MAX_SKIPPED_LISTED:
            self.skipped.append({"name": name[:500], "reason": reason, **extra})

    def add(self, name: str, upload: UploadedFile) -> None:
        if self.broker_down is not None:
            self.skip(name, f"Not stored: {self.broker_down} Upload it again.")
            return
        try:
            document, created = document_create(owner=self.owner, upload=upload, groups=self.groups, batch=self.batch)
        except UploadRejected as exc:
            self.skip(name, str(exc))
            return
        except BrokerUnavailable as exc:  # every later file would fail the same way
            self.broker_down = exc
            self.skip(name, f"Not stored: {exc} Upload it again.")
            return
        except Exception:  # one file that breaks something unforeseen fails alone, not the batch
            logger.exception("batch %s: %s could not be stored", self.batch.pk, name)
            self.skip(name, "Not stored: an internal error, logged for the administrator. Upload it again later.")
            return
        if not created:
            self.skip(name, f"Already in your library as “{document.title}”: not read again.", document_id=document.pk)
            return
        self.files += 1
        self.created.append(document)

    def add_archive(self, upload: UploadedFile) -> None:
        name = upload.name or "archive.zip"
        if upload.size is not None and upload.size > max_upload_bytes():
            self.skip(
                name,
                f"The archive is {upload.size / 1024 / 1024:.1f} MB; an upload may be at most "
                f"{settings.APPLIANCE_MAX_UPLOAD_MB} MB. Split it into smaller archives.",
            )
            return
        if upload.file is None:
            self.skip(name, "The archive could not be read. Upload it again.")
            return
        upload.seek(0)
        try:
            for entry in read_zip(upload.file, limits=archive_limits()):
                if isinstance(entry, Member):
                    member = SimpleUploadedFile(PurePath(entry.name).name, entry.data)
                    self.add(entry.name, member)
                else:
                    self.skip(entry.name, entry.reason)
        except ArchiveRefused as exc:
            self.skip(name, str(exc))


def batch_create(
    *, owner: User, uploads: Iterable[UploadedFile], groups: Iterable[Group] = ()
) -> tuple[Batch, list[Document]]:
    """A batch of ``uploads`` (files, and zips whose files are taken), each queued for ingestion;
    returns it with the documents it made (for the caller's audit log).
    Raises ``UploadRejected`` with nothing to upload, ``BrokerUnavailable`` (nothing stored)
    when the broker does not answer at the start."""
    uploads = list(uploads)
    if not uploads:
        raise UploadRejected("Choose at least one file (or a zip of a folder) to upload.")
    broker_check()
    name = uploads[0].name if len(uploads) == 1 else f"{len(uploads)} files"
    batch = Batch.objects.create(owner=owner, name=(name or "upload")[:255])
    found = _Collector(owner=owner, batch=batch, groups=list(groups))
    try:
        for upload in uploads:
            if is_archive(upload):
                found.add_archive(upload)
            else:
                found.add(upload.name or "upload", upload)
    finally:  # what was stored is counted, whatever stopped the rest
        Batch.objects.filter(pk=batch.pk).update(
            files_total=found.files, files_skipped=found.files - len(found.created), skipped=found.skipped
        )
        batch_settle(batch_id=batch.pk, filled=True)  # all read already, or nothing to read (all skipped)
    batch.refresh_from_db()
    return batch, found.created


def batch_cancel(*, batch: Batch, user: User) -> bool:
    """Cancel a batch: its files not started yet are not read, the one being read stops at its
    worker's next check, what is done stays. Owner only. False when it had already finished."""
    if batch.owner_id != user.pk:
        raise NotAllowed("Only the person who uploaded a batch can cancel it.")
    in_batch = Q(batch=batch) | Q(parent__batch=batch)  # its files, and their e-mails' attachments
    with transaction.atomic():
        if not Batch.objects.filter(pk=batch.pk, state=Batch.State.RUNNING).update(state=Batch.State.CANCELLED):
            return False
        # As document_cancel does, for every file at once: not started -> cancelled now (its
        # queued task will find it finished); being read -> stopped at the worker's next check.
        Document.objects.filter(in_batch, state=Document.State.UPLOADED).update(
            state=Document.State.CANCELLED, cancel_requested=False, failure_reason=""
        )
        Document.objects.filter(
            in_batch, state__in=[Document.State.EXTRACTING, Document.State.EMBEDDING], cancel_requested=False
        ).update(cancel_requested=True)
    batch_settle(batch_id=batch.pk)
    batch.refresh_from_db()
    return True
