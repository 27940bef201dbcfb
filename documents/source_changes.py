"""What a source's poll has to do, decided from what the last poll recorded and what is there now
(pure: no ORM, no file system, no network; ``documents.source_services`` does the reading).

A folder of ten years of files is polled every few minutes, so a file is hashed again only when
its size or modification time changed since the last poll; whether it became a new document is
then the content hash's decision (the service's). A file modified in the last few seconds is left
for the next poll: it may still be being copied onto the share. A folder that lists nothing where
the last poll saw files is not taken as "everything was deleted": an unmounted share looks exactly
like that.

A mailbox is read by UID: UIDs only grow within one UIDVALIDITY, so the last UID taken is where
the next poll starts; a new UIDVALIDITY (the mailbox was rebuilt) starts again from the first
message, and the content hash keeps the messages already taken from becoming documents twice.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

# Files a folder holds that are not documents yet: editors' lock and swap files, downloads and
# copies in progress. Hidden files and folders (".git", ".DS_Store") are left out too.
TEMPORARY_PREFIXES = ("~$", ".~lock.")
TEMPORARY_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".swp")


@dataclass(frozen=True)
class Seen:
    """A file as the last poll recorded it."""

    size_bytes: int
    mtime_ns: int
    present: bool  # False: the last poll found it gone (the document is marked removed)


@dataclass(frozen=True)
class Listed:
    """A file as the folder lists it now."""

    size_bytes: int
    mtime_ns: int
    path: str = ""  # where it is opened, when that is not its key (a name that is not UTF-8)


@dataclass(frozen=True)
class FolderChanges:
    to_read: list[str]  # new, or changed in size or time: read and hash (path order)
    back: list[str]  # gone at the last poll, back unchanged: present again, nothing to read
    removed: list[str]  # present at the last poll, gone now
    settling: list[str]  # modified too recently: left for the next poll


class FolderLooksUnmounted(Exception):
    """The folder lists no file where the last poll saw some: most likely a share that is not
    mounted, not a folder emptied on purpose. Nothing is marked removed."""


def wanted(relative_path: str, *, patterns: Iterable[str], suffixes: Iterable[str]) -> bool:
    """Whether a file of the folder is one to take: not hidden, not temporary, and matching one
    of ``patterns`` (against its path in the folder or its name) or, with none given, with a
    suffix the appliance reads."""
    path = PurePosixPath(relative_path)
    if any(part.startswith(".") for part in path.parts) or path.name.startswith(TEMPORARY_PREFIXES):
        return False
    if path.name.lower().endswith(TEMPORARY_SUFFIXES):
        return False
    patterns = [pattern for pattern in patterns if pattern]
    if patterns:
        return any(
            fnmatch.fnmatchcase(relative_path, pattern) or fnmatch.fnmatchcase(path.name, pattern)
            for pattern in patterns
        )
    return path.suffix.lower() in set(suffixes)


def folder_changes(
    seen: Mapping[str, Seen], listed: Mapping[str, Listed], *, now_ns: int, settle_ns: int
) -> FolderChanges:
    """What a poll does with each file, from ``seen`` (the last poll's record, by path) and
    ``listed`` (the folder now). Raises ``FolderLooksUnmounted`` when nothing is listed and the
    last poll saw files present."""
    if not listed and any(entry.present for entry in seen.values()):
        raise FolderLooksUnmounted()
    to_read, back, settling = [], [], []
    for path in sorted(listed):
        now = listed[path]
        before = seen.get(path)
        if before is not None and (before.size_bytes, before.mtime_ns) == (now.size_bytes, now.mtime_ns):
            if not before.present:
                back.append(path)
            continue
        if now_ns - now.mtime_ns < settle_ns:
            settling.append(path)
            continue
        to_read.append(path)
    removed = sorted(path for path, entry in seen.items() if entry.present and path not in listed)
    return FolderChanges(to_read=to_read, back=back, removed=removed, settling=settling)


@dataclass(frozen=True)
class MailboxPlan:
    uids: list[int]  # the messages to take this poll, oldest first
    restart: bool  # a UIDVALIDITY not seen before: the mailbox is read from its first message
    more: int  # messages beyond this poll's limit, for the next


def mailbox_plan(
    *, known_uidvalidity: int | None, last_uid: int, uidvalidity: int, found_uids: Iterable[int], limit: int
) -> MailboxPlan:
    """The UIDs a poll fetches: those above the last one taken (all of them under a new
    UIDVALIDITY), oldest first, at most ``limit``. ``found_uids`` may hold UIDs at or below the
    last (``UID SEARCH UID n:*`` answers the highest UID even when it is below ``n``)."""
    restart = known_uidvalidity != uidvalidity
    floor = 0 if restart else last_uid
    newer = sorted({uid for uid in found_uids if uid > floor})
    return MailboxPlan(uids=newer[:limit], restart=restart, more=max(0, len(newer) - limit))


def item_key(uidvalidity: int, uid: int) -> str:
    """How a message is named among a source's items."""
    return f"{uidvalidity}:{uid}"


def poll_summary(counts: Mapping[str, int]) -> str:
    """ "3 new, 1 changed, 2 removed" from the counts that are not zero; "nothing new" if none."""
    words = [f"{count} {what}" for what, count in counts.items() if count]
    return ", ".join(words) if words else "nothing new"
