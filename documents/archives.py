"""A zip of a folder, opened safely for a batch upload. Pure: a file object in, members and
reasons out, no ORM and no I/O beyond the argument.

An archive someone else made can be hostile, and the web process opens it, so nothing here
trusts what the archive says about itself:

- the whole archive is refused (``ArchiveRefused``, with a reason a person understands) when it
  is not a readable zip, holds more than ``max_members`` files, or declares more than
  ``max_total_bytes`` uncompressed;
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

import stat
import zipfile
import zlib
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
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
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
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
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
