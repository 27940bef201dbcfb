"""A zip of a folder, opened safely for a batch upload. Pure: a file object in, members and
reasons out, no ORM and no I/O beyond the argument.

An archive someone else made can be hostile, and the web process opens it, so nothing here
trusts what the archive says about itself:

- the whole archive is refused (``ArchiveRefused``, with a reason a person understands) when it
  is not a readable zip (whatever the zip reader raises on it), its table of contents (the
  central directory, which the zip reader holds in memory entire) is larger than
  ``max_members`` files can need, it holds more than ``max_members`` files, or it declares more
  than ``max_total_bytes`` uncompressed;
- a member is skipped, with its reason, when its name leads outside the folder (``../``, an
  absolute path, a drive letter), it is a link, encrypted, an archive itself (nested archives
  are not opened), not a supported document type, over the per-file limit, compressed more than
  ``max_ratio`` times (a zip bomb), or damaged; folder metadata (``__MACOSX``, hidden files) is
  skipped the same way;
- members are read one at a time, never more than their declared size, and the bytes actually
  read are counted against ``max_total_bytes`` too.

Members that pass are returned as bytes with their path inside the archive; their content is
then checked like any upload's, in the extraction sandbox.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO

ZIP_MAGIC = b"PK\x03\x04"
EMPTY_ZIP_MAGIC = b"PK\x05\x06"
DOCUMENT_SUFFIXES = frozenset({".pdf", ".docx", ".txt", ".text", ".md", ".markdown", ".eml"})
ARCHIVE_SUFFIXES = frozenset(
    {".zip", ".jar", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".7z", ".rar", ".zst", ".cab", ".iso"}
)
SUPPORTED_WORDS = "PDF, Word .docx, text, Markdown and e-mail .eml"
# Below this size a high compression ratio is harmless (a page of spaces compresses 1000 times).
RATIO_FLOOR_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024
# What one entry of the table of contents may take, for the check before the zip reader loads
# it: the fixed 46 bytes and room for a long path and its extra fields. Entries per file
# allowed: folders, and the "._" companions a Mac's zip adds, are entries too.
CENTRAL_ENTRY_BYTES = 46 + 1024
CENTRAL_ENTRIES_PER_FILE = 4
_END = struct.Struct("<4s4H2LH")  # the end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int = 1000
    max_total_bytes: int = 2 * 1024**3
    max_member_bytes: int = 100 * 1024**2
    max_ratio: float = 100.0


@dataclass(frozen=True)
class Member:
    name: str  # the path inside the archive, e.g. "contracts/2019/lease.pdf"
    data: bytes


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


class ArchiveRefused(ValueError):
    """The archive as a whole is not opened; the message is for the person who uploaded it."""


def looks_like_zip(head: bytes) -> bool:
    return head.startswith((ZIP_MAGIC, EMPTY_ZIP_MAGIC))


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def unsafe_name_reason(name: str) -> str:
    """Why a member's name may not be used ("" when it may): it must stay inside the folder."""
    if "\x00" in name:
        return "Its name holds a NUL character: refused."
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        return "Its name is an absolute path, which would point outside the folder: refused."
    if ".." in PurePosixPath(posix).parts:
        return "Its name climbs out of the folder (“..”), which could overwrite another file: refused."
    return ""


def member_skip_reason(info: zipfile.ZipInfo, limits: ArchiveLimits) -> str:
    """Why a member is not taken, from what the archive declares ("" when it is taken)."""
    reason = unsafe_name_reason(info.filename)
    if reason:
        return reason
    path = PurePosixPath(info.filename.replace("\\", "/"))
    if stat.S_ISLNK(info.external_attr >> 16):
        return "It is a symbolic link, not a file: refused."
    if "__MACOSX" in path.parts or any(part.startswith(".") for part in path.parts):
        return "Folder metadata or a hidden file (__MACOSX, a name starting with “.”), not a document."
    suffix = path.suffix.lower()
    if suffix in ARCHIVE_SUFFIXES:
        return "An archive inside the archive: nested archives are not opened. Unpack it and upload its files."
    if suffix not in DOCUMENT_SUFFIXES:
        kind = f"“{suffix}” files are" if suffix else "A file with no extension is"
        return f"{kind} not a document type the appliance reads ({SUPPORTED_WORDS})."
    if info.flag_bits & 0x1:
        return "It is encrypted: the appliance cannot read it without the password."
    if info.file_size > limits.max_member_bytes:
        return f"It is {_mb(info.file_size)}; one file may be at most {_mb(limits.max_member_bytes)}."
    if info.file_size == 0:
        return "It is empty."
    ratio = info.file_size / max(info.compress_size, 1)
    if info.file_size > RATIO_FLOOR_BYTES and ratio > limits.max_ratio:
        return f"It is compressed {ratio:.0f} times (a zip bomb?); at most {limits.max_ratio:.0f} times is accepted."
    return ""


def read_zip(file: IO[bytes], *, limits: ArchiveLimits) -> Iterator[Member | Skipped]:
    """The archive's files in order, each a ``Member`` to ingest or a ``Skipped`` with its
    reason. Raises ``ArchiveRefused`` before yielding anything when the archive as a whole is
    refused. Folders themselves are not listed."""
    table = _central_directory_bytes(file)
    if table is not None and table > limits.max_members * CENTRAL_ENTRIES_PER_FILE * CENTRAL_ENTRY_BYTES:
        raise ArchiveRefused(
            f"The archive's table of contents is {_mb(table)}, more than {limits.max_members} files need; one "
            f"archive may hold at most {limits.max_members}. Split it into smaller archives."
        )
    try:
        file.seek(0)
        archive = zipfile.ZipFile(file)
    except MemoryError:
        raise
    except Exception as exc:  # the zip reader raises many kinds on hostile input (LZMAError, a negative seek, ...)
        raise ArchiveRefused(f"This is not a zip archive the appliance can read ({exc}).") from None
    with archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
        if len(infos) > limits.max_members:
            raise ArchiveRefused(
                f"The archive holds {len(infos)} files; one archive may hold at most {limits.max_members}. "
                "Split it into smaller archives."
            )
        declared = sum(info.file_size for info in infos)
        if declared > limits.max_total_bytes:
            raise ArchiveRefused(
                f"The archive unpacks to {_mb(declared)}; one archive may unpack to at most "
                f"{_mb(limits.max_total_bytes)}. Split it into smaller archives."
            )
        read_total = 0
        for info in infos:
            name = info.filename
            reason = member_skip_reason(info, limits)
            if reason:
                yield Skipped(name, reason)
                continue
            try:
                data = _read_member(archive, info)
            except MemoryError:
                raise
            except Exception as exc:  # a damaged stream of any method: zlib, bz2 and lzma errors, bad offsets
                yield Skipped(name, f"It is damaged and could not be unpacked ({exc}).")
                continue
            if len(data) > info.file_size:
                yield Skipped(name, "It unpacks to more than the archive declares (a zip bomb?): refused.")
                continue
            read_total += len(data)
            if read_total > limits.max_total_bytes:
                yield Skipped(name, f"The archive's files passed {_mb(limits.max_total_bytes)} in all here.")
                continue
            yield Member(name, data)


def _central_directory_bytes(file: IO[bytes]) -> int | None:
    """The size of the archive's table of contents as its end record declares it (the zip64
    record's, when there is one), read before the zip reader loads the table; None when there is
    no end record (the zip reader then refuses the archive)."""
    try:
        size = file.seek(0, os.SEEK_END)
        tail_bytes = min(size, _END.size + 0xFFFF)  # the record, and a comment of at most 64 KiB
        file.seek(size - tail_bytes)
        tail = file.read(tail_bytes)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + _END.size > len(tail):
            return None
        table = int(_END.unpack_from(tail, at)[5])
        # A zip64 locator just before the record is read whatever the record says, as the zip
        # reader reads it.
        locator = at - _END64_LOCATOR.size
        if locator < 0 or tail[locator : locator + 4] != b"PK\x06\x07":
            return table
        file.seek(_END64_LOCATOR.unpack_from(tail, locator)[2])
        record = file.read(_END64.size)
        if len(record) < _END64.size or record[:4] != b"PK\x06\x06":
            return table
        return int(_END64.unpack(record)[8])
    except (OSError, ValueError, struct.error):
        return None


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """At most one byte more than the member declares (which then refuses it)."""
    parts: list[bytes] = []
    left = info.file_size + 1
    with archive.open(info) as handle:
        while left > 0:
            chunk = handle.read(min(READ_CHUNK_BYTES, left))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
    return b"".join(parts)
