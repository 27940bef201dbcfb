"""Which format a file is, from its contents (magic bytes, structure); the name and content type
are only hints."""

from __future__ import annotations

import io
import logging
import re
import zipfile
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from documents.extraction.base import (
    _DOCX_ERRORS,
    DOCX_LOCKED_MESSAGE,
    KIND_DOCX,
    KIND_EMAIL,
    KIND_MARKDOWN,
    KIND_PDF,
    KIND_TEXT,
    NOT_A_DOCX_MESSAGE,
    OLE2_MAGIC,
    PDF_MAGIC,
    ZIP_MAGICS,
    ExtractionError,
    _unsupported,
)

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


_EMAIL_KEY_HEADERS = {"from", "to", "cc", "subject", "date", "mime-version", "message-id", "received", "return-path"}


_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")  # RFC 5322 field name: printable ASCII except ":"


def detect_kind(data: bytes, *, filename: str = "", content_type: str = "") -> str:
    """The Document.Kind of ``data``, from its contents; raises ExtractionError for other formats."""
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    content_type = content_type.split(";")[0].strip().lower()
    if _looks_like_pdf(data):
        return KIND_PDF
    if suffix == ".pdf" or content_type == "application/pdf":
        raise ExtractionError("This file is not a PDF: its contents do not start like a PDF.")
    if data.startswith(ZIP_MAGICS):
        if _zip_holds_word_document(data, suffix):
            return KIND_DOCX
        if suffix == ".docx":
            raise ExtractionError(NOT_A_DOCX_MESSAGE)
        _unsupported("it is a ZIP archive (.xlsx, .pptx, .odt and other archives cannot be read)")
    if data.startswith(OLE2_MAGIC):
        if suffix == ".docx":
            raise ExtractionError(DOCX_LOCKED_MESSAGE)
        if suffix == ".doc":
            raise ExtractionError("Old Word .doc files cannot be read. Save it as .docx or PDF and upload it again.")
        _unsupported("it is an old Microsoft Office file (.doc, .xls, .ppt or Outlook .msg)")
    hint = _binary_format_hint(data)
    if hint:
        _unsupported(hint)
    if suffix == ".docx":
        raise ExtractionError("This file is not a Word .docx document: its contents do not start like one.")
    if _looks_like_email(data, hinted=suffix == ".eml" or content_type == "message/rfc822"):
        return KIND_EMAIL
    if suffix in {".md", ".markdown"} or content_type in {"text/markdown", "text/x-markdown"}:
        return KIND_MARKDOWN
    return KIND_TEXT


def _looks_like_pdf(data: bytes) -> bool:
    """The header first, or (as Acrobat accepts) after some junk in the first 1024 bytes when the
    end looks like a PDF's end too: a text that merely mentions "%PDF-" early on stays text."""
    position = data.find(PDF_MAGIC, 0, 1024)
    if position == -1:
        return False
    return not data[:position].strip() or b"%%EOF" in data[-2048:] or b"startxref" in data[-4096:]


_BINARY_MAGICS = [
    (b"\x89PNG\r\n\x1a\n", "it is a PNG image"),
    (b"\xff\xd8\xff", "it is a JPEG image"),
    (b"GIF87a", "it is a GIF image"),
    (b"GIF89a", "it is a GIF image"),
    (b"II*\x00", "it is a TIFF image"),
    (b"MM\x00*", "it is a TIFF image"),
    (b"\x1f\x8b", "it is a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "it is a 7-Zip archive"),
    (b"Rar!\x1a\x07", "it is a RAR archive"),
    (b"{\\rtf", "it is a Rich Text (.rtf) file; save it as .docx or PDF"),
]


def _binary_format_hint(data: bytes) -> str:
    for magic, hint in _BINARY_MAGICS:
        if data.startswith(magic):
            return hint
    return ""


def _zip_holds_word_document(data: bytes, suffix: str) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return "word/document.xml" in archive.namelist()
    except _DOCX_ERRORS as exc:
        logger.info("unreadable ZIP: %r", exc)
        if suffix == ".docx":
            raise ExtractionError("This Word document is damaged or incomplete and cannot be read.") from exc
        raise ExtractionError(
            "This file is damaged or incomplete: it starts like a ZIP archive or Word document but cannot be opened."
        ) from exc


def _looks_like_email(data: bytes, *, hinted: bool) -> bool:
    """RFC 822 headers from the first line to the first blank line, with the usual fields in them.

    Two of the usual fields are enough; one is enough for a file named .eml (a note that merely
    starts with "Subject: ..." is still a note)."""
    head = data[:16384]
    if head.startswith(b"From "):  # an mbox envelope line before the headers
        head = head.split(b"\n", 1)[1] if b"\n" in head else b""
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    if len(head) == 16384:
        lines = lines[:-1]  # the last line may be cut off
    key_headers = 0
    header_lines = 0
    for line in lines:
        if not line.strip():
            break
        if line[:1] in (b" ", b"\t"):
            if not header_lines:
                return False
            continue
        if not _HEADER_LINE.match(line):
            return False
        header_lines += 1
        if line.split(b":", 1)[0].strip().lower().decode("ascii") in _EMAIL_KEY_HEADERS:
            key_headers += 1
    return key_headers >= 2 or (hinted and key_headers >= 1)
