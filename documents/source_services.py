"""Polling sources: watched folders and IMAP mailboxes an administrator configured (``Source``),
whose new and changed files and new messages become documents of the source's owner, shared
with its groups, by the upload's own path (``document_create``: the same limits, the same
content-hash dedupe, the same extraction sandbox, so a hostile file fails alone).

- **Once**: a file is read only when its size or time changed since the last poll, and becomes a
  new document only when its bytes did. A mailbox is read from the UID after the last one taken.
- **Changed**: a file whose bytes changed becomes a new document; the old one stays (summaries
  and drafts cite it) marked ``replaced_by`` the new one, out of search and the library list.
- **Removed**: a file deleted from the folder leaves its document marked ``source_removed_at``
  (shown on its page and in the library), never deleted: the folder is not the library's master
  copy, and a share that is briefly unmounted must not empty it (``source_changes``).
- **Never twice at once**: a poll holds its source by a lease (``poll_started_at``, compare-and-
  set) that a worker killed mid-poll leaves to expire.
- **Bad input loses nothing**: a file that cannot be taken is recorded with the reason and
  tried again when it changes; a mailbox that cannot be read leaves the reason on the source and
  the next poll starts where this one stopped. When the owner's queue or storage is full, the
  poll stops and the next goes on from there.

A poll's new documents form a batch of the owner's, followed on its page like an upload's.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import os
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from appliance.broker import BrokerUnavailable
from documents.archives import DOCUMENT_SUFFIXES
from documents.extraction.base import undo_surrogate_escapes
from documents.mailbox import Mailbox, MailboxAccess, MailboxError
from documents.models import Batch, Document, Source, SourceItem
from documents.services import UploadRejected, batch_settle, document_create, max_upload_bytes
from documents.source_changes import (
    FolderLooksUnmounted,
    Listed,
    Seen,
    folder_changes,
    item_key,
    mailbox_plan,
    poll_summary,
    wanted,
)

logger = logging.getLogger(__name__)

# A poll stops taking new items after this long (the rest at the next poll), well inside its
# task's time limit (documents.tasks.SOURCE_POLL_TIME_LIMIT_S); a poll marked as running for
# longer than the lease was in a worker that died, and the source may be polled again.
POLL_BUDGET_S = 600
POLL_LEASE_S = 1800


class SourceUnavailable(Exception):
    """The source could not be polled (or not to the end); the message is for the administrator."""


class _OwnerFull(Exception):
    """The owner's ingest queue or storage is full: stop, and go on at the next poll."""


@dataclass
class _Poll:
    """What one poll did, counted for the source's ``last_result``."""

    source: Source
    started: float = field(default_factory=time.monotonic)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("new", "changed", "removed", "back", "already in the library", "failed", "waiting"), 0
        )
    )
    batch: Batch | None = None
    created: int = 0
    note: str = ""
    backlog: bool = False  # stopped before the end (the owner's queue full): poll again soon
    groups: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.groups = list(self.source.groups.all())

    def out_of_time(self) -> bool:
        return time.monotonic() - self.started > POLL_BUDGET_S

    def take(self, *, name: str, data: bytes, content_type: str, path: str) -> tuple[Document, bool]:
        """``data`` as a document of the source's (``document_create``), in this poll's batch."""
        source = self.source
        if self.batch is None:
            self.batch = Batch.objects.create(owner=source.owner, name=f"{source.name} (source)"[:255])
        content_type = content_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        upload = SimpleUploadedFile(name, data, content_type=content_type)
        try:
            document, created = document_create(owner=source.owner, upload=upload, groups=self.groups, batch=self.batch)
        except UploadRejected as exc:
            if exc.code in ("ingest-queue-full", "storage-quota"):
                raise _OwnerFull(str(exc)) from exc
            raise
        except BrokerUnavailable as exc:
            raise SourceUnavailable(f"{exc} Nothing was lost: the next poll takes the rest.") from exc
        self.created += created
        # The document says where it came from (a file already uploaded by hand keeps its own).
        Document.objects.filter(pk=document.pk, source__isnull=True).update(source=source, source_path=path[:1000])
        Document.objects.filter(pk=document.pk).update(source_removed_at=None)
        return document, created

    def finish_batch(self) -> None:
        if self.batch is None:
            return
        if not self.created:  # every file was in the library already
            self.batch.delete()
            return
        # Until now files_total was 0, so a worker that read every document taken so far left
        # the batch running (services.batch_settle); now it is counted, and settled if all are read.
        Batch.objects.filter(pk=self.batch.pk).update(files_total=self.created)
        batch_settle(batch_id=self.batch.pk, filled=True)


# --- which sources, and holding one --------------------------------------------------------------


def sources_due(*, now: datetime | None = None) -> list[int]:
    """Ids of the enabled sources whose interval has passed since their last poll, and which no
    poll holds (a handful of rows: decided here rather than in SQL)."""
    now = now or timezone.now()
    due = []
    for source in Source.objects.filter(enabled=True).only(
        "pk", "poll_interval_s", "last_polled_at", "poll_started_at", "backlog"
    ):
        if source.poll_started_at is not None and now - source.poll_started_at < timedelta(seconds=POLL_LEASE_S):
            continue
        interval = timedelta(seconds=source.poll_interval_s)
        if source.backlog or source.last_polled_at is None or now - source.last_polled_at >= interval:
            due.append(source.pk)
    return due


def _hold(source_id: int, now: datetime) -> bool:
    """Take the source's lease (compare-and-set): False when a live poll holds it."""
    free = Q(poll_started_at__isnull=True) | Q(poll_started_at__lt=now - timedelta(seconds=POLL_LEASE_S))
    return bool(Source.objects.filter(free, pk=source_id).update(poll_started_at=now))


def source_poll(*, source_id: int, only_if_due: bool = False) -> Source | None:
    """Poll a source once: take what is new or changed, mark what was removed, and record the
    result or the reason it failed on the source. Returns the source, or None when it is gone,
    disabled, held by another poll or (``only_if_due``) not due."""
    now = timezone.now()
    if only_if_due and source_id not in sources_due(now=now):
        return None
    if not Source.objects.filter(pk=source_id, enabled=True).exists() or not _hold(source_id, now):
        return None
    source = Source.objects.select_related("owner").get(pk=source_id)
    poll = _Poll(source)
    error = ""
    try:
        _check(source)
        if source.kind == Source.Kind.FOLDER:
            _poll_folder(poll)
        else:
            _poll_mailbox(poll)
    except SourceUnavailable as exc:
        error = str(exc)
    except _OwnerFull as exc:  # not a failure: the source is taken at the pace the workers read
        poll.note = f"stopped for now, the next poll goes on: {exc}"
        poll.backlog = True
    except Exception:
        logger.exception("source %s: the poll failed", source_id)
        error = "An internal error stopped this poll; the administrator can find it in the logs."
    finally:
        poll.finish_batch()
        finished = timezone.now()
        updates: dict = {
            "poll_started_at": None,
            "last_polled_at": finished,
            "last_result": "; ".join(filter(None, [poll_summary(poll.counts), poll.note]))[:500],
            "last_error": error,
            "backlog": (poll.backlog or bool(poll.counts["waiting"])) and not error,
        }
        if not error:
            updates["last_success_at"] = finished
        Source.objects.filter(pk=source_id, poll_started_at=now).update(**updates)
    return Source.objects.filter(pk=source_id).first()


def _check(source: Source) -> None:
    """The admin form's checks, again at each poll: a source saved another way, or settings
    changed since (``APPLIANCE_VAR_DIR``), is not polled with what the form would refuse."""
    try:
        source.clean()
    except ValidationError as exc:
        raise SourceUnavailable("This source's settings are refused: " + " ".join(exc.messages)) from exc


# --- a watched folder ----------------------------------------------------------------------------


def _poll_folder(poll: _Poll) -> None:
    source = poll.source
    root = Path(source.folder_path)
    if not root.is_dir():
        raise SourceUnavailable(f"The folder {root} does not exist or is not a folder: is the share mounted?")
    # Resolved once: every file is listed and then opened inside the folder as it was at the start.
    root = root.resolve()
    listed, unlisted = _list_folder(root, patterns=source.include_patterns.split())
    fields = ("key", "state", "size_bytes", "mtime_ns", "sha256", "document_id")
    items = {item.key: item for item in SourceItem.objects.filter(source=source).only(*fields)}
    seen = {
        key: Seen(size_bytes=item.size_bytes, mtime_ns=item.mtime_ns, present=item.state != SourceItem.State.MISSING)
        for key, item in items.items()
    }
    try:
        changes = folder_changes(
            seen, listed, now_ns=time.time_ns(), settle_ns=settings.APPLIANCE_SOURCE_SETTLE_S * 1_000_000_000
        )
    except FolderLooksUnmounted:
        raise SourceUnavailable(
            f"The folder {root} is empty, where the last poll found files: is the share mounted? Nothing was "
            f"marked removed."
        ) from None
    poll.counts["waiting"] += len(changes.settling)
    to_read = list(changes.to_read)
    for key in changes.back:
        if items[key].document_id is None:  # back, but never taken (it had failed): read it
            to_read.append(key)
            continue
        _mark_back(items[key])
        poll.counts["back"] += 1
    if unlisted:
        # A subfolder that could not be listed is not a subfolder whose files were deleted.
        removed: list[str] = []
    else:
        removed = changes.removed
    for key in removed:
        _mark_removed(source, items[key])
        poll.counts["removed"] += 1
    limit = settings.APPLIANCE_SOURCE_MAX_ITEMS_PER_POLL
    for taken, key in enumerate(to_read):
        if taken >= limit or poll.out_of_time():
            poll.counts["waiting"] += len(to_read) - taken
            break
        try:
            _take_file(poll, root, key, listed[key], items.get(key))
        except (SourceUnavailable, _OwnerFull):
            raise
        except Exception:  # one file that breaks something unforeseen fails alone; the poll goes on
            logger.exception("source %s: %s could not be taken", source.pk, key)
            _failed(poll, key, "An internal error stopped this file; the administrator can find it in the logs.",
                    size_bytes=listed[key].size_bytes, mtime_ns=listed[key].mtime_ns)  # fmt: skip
    if unlisted:
        raise SourceUnavailable(
            f"{len(unlisted)} subfolder(s) could not be read, so nothing under them was marked removed: "
            + "; ".join(unlisted[:3])
        )


def _list_folder(root: Path, *, patterns: list[str]) -> tuple[dict[str, Listed], list[str]]:
    """The files of the folder ``root`` (a resolved path) to take, by path inside it, and the
    subfolders that could not be listed (with the reason). Links are followed only to files
    inside the folder."""
    listed: dict[str, Listed] = {}
    unlisted: list[str] = []

    def note(error: OSError) -> None:
        unlisted.append(f"{error.filename}: {error.strerror}")

    for directory, subdirectories, files in os.walk(root, onerror=note):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
        for name in files:
            full = Path(directory) / name
            relative = full.relative_to(root).as_posix()
            if not wanted(relative, patterns=patterns, suffixes=DOCUMENT_SUFFIXES):
                continue
            # Recorded (and shown) by a name Postgres can store: a name that is not UTF-8 (Latin-1
            # on an old share) is listed by Python with surrogate escapes, and stalled every poll.
            key = undo_surrogate_escapes(relative).encode("utf-8", errors="replace").decode("utf-8")
            try:
                info = full.stat()
                if full.is_symlink() and not full.resolve().is_relative_to(root):
                    continue
            except OSError:
                continue  # a dangling link, or a file deleted while listed
            if stat.S_ISREG(info.st_mode):
                path = "" if key == relative else relative
                listed[key] = Listed(size_bytes=info.st_size, mtime_ns=info.st_mtime_ns, path=path)
    return listed, unlisted


class _NotTaken(Exception):
    """A listed file that is not read after all; the message says why."""


def _read_listed(root: Path, relative: str, *, limit: int) -> bytes:
    """The bytes of a file the listing found in ``root`` (resolved), checked again as it is
    opened: the file, or a folder above it, may have been swapped since (a listing is minutes
    old by the time its last files are read) for a link to a file outside the folder, a FIFO
    (whose open would wait for a writer for ever) or a much larger file: ``_NotTaken`` says
    which. At most ``limit`` + 1 bytes are read."""
    fd = os.open(root / relative, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotTaken("It is no longer a regular file (a pipe or device put in its place): not read.")
        if not Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(root):
            raise _NotTaken("It now leads outside the folder (a link put in its place): not read.")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _NotTaken(
            f"It grew past {settings.APPLIANCE_MAX_UPLOAD_MB} MB since it was listed; documents may be at most that "
            f"(APPLIANCE_MAX_UPLOAD_MB)."
        )
    return data


def _take_file(poll: _Poll, root: Path, key: str, now: Listed, item: SourceItem | None) -> None:
    source = poll.source
    record = {"size_bytes": now.size_bytes, "mtime_ns": now.mtime_ns}
    try:
        if now.size_bytes > max_upload_bytes():
            raise _NotTaken(_too_large(now.size_bytes))
        data = _read_listed(root, now.path or key, limit=max_upload_bytes())
    except OSError as exc:
        _failed(poll, key, f"The file could not be read: {exc.strerror}.", **record)
        return
    except _NotTaken as exc:
        _failed(poll, key, str(exc), **record)
        return
    sha256 = hashlib.sha256(data).hexdigest()
    previous = item.document_id if item is not None else None
    if item is not None and previous is not None and item.sha256 == sha256:
        # Touched, or copied over with the same bytes: nothing to read again.
        _record(source, key, state=SourceItem.State.PRESENT, error="", sha256=sha256, document_id=previous, **record)
        if item.state == SourceItem.State.MISSING:
            Document.objects.filter(pk=previous).update(source_removed_at=None)
            poll.counts["back"] += 1
        return
    try:
        document, created = poll.take(name=Path(key).name, data=data, content_type="", path=key)
    except UploadRejected as exc:
        _failed(poll, key, str(exc), sha256=sha256, **record)
        return
    with transaction.atomic():
        _record(source, key, state=SourceItem.State.PRESENT, error="", sha256=sha256, document=document, **record)
        if previous is not None and previous != document.pk:
            # The file's bytes now are current, even when it changed back to an earlier version's.
            Document.objects.filter(pk=document.pk).update(replaced_by=None)
            copies = SourceItem.objects.filter(source=source, document_id=previous, state=SourceItem.State.PRESENT)
            if not copies.exists():  # a copy elsewhere in the folder still holds the old bytes: not replaced
                Document.objects.filter(pk=previous).update(replaced_by=document)
    poll.counts["changed" if previous is not None else "new" if created else "already in the library"] += 1


def _too_large(size_bytes: int, what: str = "file") -> str:
    return (
        f"The {what} is {size_bytes / 1024 / 1024:.1f} MB; documents may be at most "
        f"{settings.APPLIANCE_MAX_UPLOAD_MB} MB (APPLIANCE_MAX_UPLOAD_MB)."
    )


def _record(source: Source, key: str, **fields) -> None:
    SourceItem.objects.update_or_create(source=source, key=key[:1000], defaults=fields)


def _failed(poll: _Poll, key: str, error: str, **fields) -> None:
    """The file or message ``key`` could not be taken: recorded with the reason, and counted."""
    _record(poll.source, key, state=SourceItem.State.FAILED, error=error, **fields)
    poll.counts["failed"] += 1


def _mark_back(item: SourceItem) -> None:
    SourceItem.objects.filter(pk=item.pk).update(state=SourceItem.State.PRESENT)
    if item.document_id is not None:
        Document.objects.filter(pk=item.document_id).update(source_removed_at=None)


def _mark_removed(source: Source, item: SourceItem) -> None:
    """The file is gone: its document is marked removed, unless another file of the folder
    still holds the same bytes."""
    with transaction.atomic():
        SourceItem.objects.filter(pk=item.pk).update(state=SourceItem.State.MISSING)
        if item.document_id is None:
            return
        elsewhere = SourceItem.objects.filter(
            source=source, document_id=item.document_id, state=SourceItem.State.PRESENT
        ).exists()
        if not elsewhere:
            Document.objects.filter(pk=item.document_id, source_removed_at__isnull=True).update(
                source_removed_at=timezone.now()
            )


# --- an IMAP mailbox -----------------------------------------------------------------------------


def mailbox_access(source: Source) -> MailboxAccess:
    return MailboxAccess(
        host=source.imap_host,
        port=source.imap_port_or_default,
        tls=source.imap_tls,
        ca_file=source.imap_ca_file,
        username=source.imap_username,
        password_file=source.imap_password_file,
        mailbox=source.imap_mailbox or "INBOX",
        timeout_s=settings.APPLIANCE_SOURCE_IMAP_TIMEOUT_S,
    )


def _poll_mailbox(poll: _Poll) -> None:
    """New messages, by UID, each stored as an ``.eml`` document: the e-mail ingest makes its
    attachments documents of their own. The mailbox is only read (``documents.mailbox``)."""
    source = poll.source
    access = mailbox_access(source)
    try:
        with Mailbox(access) as mailbox:
            found = mailbox.uids_from(1)  # every message: which are new, and which are gone
            plan = mailbox_plan(
                known_uidvalidity=source.imap_uidvalidity,
                last_uid=source.imap_last_uid,
                uidvalidity=mailbox.uidvalidity,
                found_uids=found,
                limit=settings.APPLIANCE_SOURCE_MAX_ITEMS_PER_POLL,
            )
            if plan.restart:
                # The UIDs of the mailbox as it was name nothing now: its messages are read again
                # (the content hash keeps each one document).
                SourceItem.objects.filter(source=source).delete()
                Source.objects.filter(pk=source.pk).update(imap_uidvalidity=mailbox.uidvalidity, imap_last_uid=0)
            else:
                poll.counts["removed"] += _mark_messages_removed(source, mailbox.uidvalidity, set(found))
            poll.counts["waiting"] += plan.more
            sizes = mailbox.sizes(plan.uids)
            for position, uid in enumerate(plan.uids):
                if poll.out_of_time():
                    poll.counts["waiting"] += len(plan.uids) - position
                    break
                _take_message(poll, mailbox, uid, sizes.get(uid), access.mailbox)
    except MailboxError as exc:
        raise SourceUnavailable(str(exc)) from exc


def _mark_messages_removed(source: Source, uidvalidity: int, found: set[int]) -> int:
    """Messages taken before that the folder no longer holds (deleted, or moved to another
    folder): their documents are marked removed, as a deleted file's are. Returns how many."""
    prefix = item_key(uidvalidity, 0)[:-1]
    gone = [
        item
        for item in SourceItem.objects.filter(source=source, state=SourceItem.State.PRESENT, key__startswith=prefix)
        .only("pk", "key", "document_id")
        .iterator()
        if int(item.key[len(prefix) :]) not in found
    ]
    for item in gone:
        _mark_removed(source, item)
    return len(gone)


def _take_message(poll: _Poll, mailbox: Mailbox, uid: int, size_bytes: int | None, folder: str) -> None:
    """``size_bytes``: the size the server listed (None: it gave none)."""
    source = poll.source
    key = item_key(mailbox.uidvalidity, uid)
    path = f"{folder}, UID {uid}"
    limit = max_upload_bytes()
    error = _too_large(size_bytes, "message") if size_bytes is not None and size_bytes > limit else ""
    data = None if error else mailbox.fetch(uid, at_most=limit)
    if data is not None and len(data) > limit:  # larger than the server listed it, or listed with no size
        size_bytes = len(data)
        error = (
            f"The message is over {settings.APPLIANCE_MAX_UPLOAD_MB} MB, more than the mail server listed; documents "
            f"may be at most that (APPLIANCE_MAX_UPLOAD_MB)."
        )
    if error:
        _failed(poll, key, error, size_bytes=size_bytes or 0)
    elif data:  # None: deleted on the server since it was listed
        try:
            document, created = poll.take(
                name=f"message-{uid}.eml", data=data, content_type="message/rfc822", path=path
            )
        except UploadRejected as exc:
            _failed(poll, key, str(exc), size_bytes=len(data))
        else:
            sha256 = hashlib.sha256(data).hexdigest()
            _record(source, key, state=SourceItem.State.PRESENT, error="", sha256=sha256, document=document,
                    size_bytes=len(data))  # fmt: skip
            poll.counts["new" if created else "already in the library"] += 1
    # Each message taken moves the mark, so a poll stopped half-way takes none of them twice.
    Source.objects.filter(pk=source.pk).update(imap_last_uid=uid)


# --- the administrator's actions -----------------------------------------------------------------


def source_poll_now(*, source: Source) -> None:
    """Queue a poll of ``source`` now, due or not (the admin console's "Poll now")."""
    from documents.tasks import poll_source

    poll_source.delay(source.pk)


def source_forget_failed(*, source: Source) -> int:
    """Let the next poll try again what could not be taken (over a limit since raised,
    unreadable then): a folder's failed files are forgotten, so the poll reads them as new; a
    mailbox is read again from its first failed message (those taken since are already in the
    library, by their content hash). Returns how many failed."""
    with transaction.atomic():
        failed = SourceItem.objects.filter(source=source, state=SourceItem.State.FAILED)
        if source.kind == Source.Kind.IMAP and source.imap_uidvalidity is not None:
            prefix = item_key(source.imap_uidvalidity, 0)[:-1]
            keys = failed.filter(key__startswith=prefix).values_list("key", flat=True)
            uids = [int(key[len(prefix) :]) for key in keys]
            if uids:
                Source.objects.filter(pk=source.pk).update(imap_last_uid=min(uids) - 1)
        forgotten, _ = failed.delete()
    return forgotten
