"""What every format shares: the results (pages, attachments), the limits, the one error a
person is shown, and the checks of the limits."""

from __future__ import annotations

import re
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn
from xml.parsers import expat

if TYPE_CHECKING:
    pass


# The values of Document.Kind (this module does not import Django).
KIND_PDF = "pdf"


KIND_TEXT = "text"


KIND_MARKDOWN = "markdown"


KIND_DOCX = "docx"


KIND_EMAIL = "email"


SUPPORTED_FORMATS = "PDF, Word .docx, text, Markdown, e-mail .eml"


TEXT_PAGE_CHARS = 3000  # the length of a made-up "page" of a format without pages


PDF_MAGIC = b"%PDF-"


ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # old .doc/.xls/.msg, and password-protected .docx


MAX_ZIP_MEMBERS = 10_000


MAX_DOCX_CORE_BYTES = 1024 * 1024  # docProps/core.xml holds a title, not a book


# Control characters are noise, and NUL cannot be stored in a Postgres text column. \n and \t stay.
# Lone surrogates (from broken PDF fonts or undecodable bytes) cannot be stored either.
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# Spaces other than " " (no-break, thin, ideographic, ...) are stored as " ", line and paragraph
# separators as line ends (each one character for one: nothing else moves). PDFs exported from
# HTML (most EDGAR filings) put a no-break space between every word: the model's tokenizer reads
# it as a character of its own, not as the space a word's token starts with (CUAD-dev's PDFs:
# 29 % more tokens in all, and words the model has not seen), and Postgres's text search as a
# letter. A quote is still checked against the stored text, which is what the model was shown.
_UNICODE_SPACES = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_UNICODE_LINE_ENDS = re.compile("[\u2028\u2029]")


_SURROGATES = re.compile(r"[\ud800-\udfff]")


def undo_surrogate_escapes(value: str) -> str:
    """Raw 8-bit bytes that arrive as surrogate escapes (an e-mail parser's 8-bit headers, a
    file name that is not UTF-8 on an old share): decoded as UTF-8, else as Windows-1252.
    Lone surrogates that are not escapes stay (``clean_text`` removes them)."""
    if not _SURROGATES.search(value):
        return value
    try:
        raw = value.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


_NOT_TEXT_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\ufffd]")


_BINARY_RATIO = 0.05  # more than this share of control characters: not a text file


# What zipfile, zlib and expat raise on a damaged archive (RuntimeError: zipfile's "encrypted").
_DOCX_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    expat.ExpatError,
    ValueError,
    OSError,
    EOFError,
    KeyError,
    NotImplementedError,
    RuntimeError,
    UnicodeError,
)


PDF_LOCKED_MESSAGE = "This PDF is protected by a password. Remove the password and upload it again."


DOCX_LOCKED_MESSAGE = "This Word document is protected by a password. Remove the password and upload it again."


NOT_A_DOCX_MESSAGE = "This file is not a Word .docx document: it is a ZIP archive without a Word document in it."


class ExtractionError(Exception):
    """The file cannot be read; the message is shown to the person who uploaded it."""


@dataclass(frozen=True)
class ExtractedPage:
    text: str
    needs_ocr: bool = False  # an image with no text layer, and no OCR engine was given
    ocr: bool = False  # the text was read from the image by OCR


@dataclass(frozen=True)
class Attachment:
    filename: str  # a bare name, no directories
    data: bytes
    content_type: str


@dataclass(frozen=True)
class ExtractedDocument:
    kind: str  # one of the Document.Kind values: "pdf", "text", "markdown", "docx", "email"
    pages: list[ExtractedPage]  # in order; page 1 is pages[0]
    title: str | None = None
    attachments: list[Attachment] = field(default_factory=list)  # e-mail attachments, read later

    @property
    def has_text(self) -> bool:
        return any(page.text.strip() for page in self.pages)


@dataclass(frozen=True)
class ExtractionLimits:
    max_pages: int = 5000
    max_chars: int = 20_000_000
    max_attachments: int = 50
    max_uncompressed_bytes: int = 200 * 1024 * 1024


DEFAULT_LIMITS = ExtractionLimits()


def page_offsets(pages: list[str], separator: str = "\n\n") -> list[int]:
    """Where each page starts in ``separator.join(pages)`` (Page.char_start)."""
    offsets = []
    position = 0
    for text in pages:
        offsets.append(position)
        position += len(text) + len(separator)
    return offsets


def _unsupported(hint: str = "") -> NoReturn:
    message = f"This file is not a supported format ({SUPPORTED_FORMATS})"
    raise ExtractionError(f"{message}; {hint}." if hint else f"{message}.")


def _check_chars(chars: int, limits: ExtractionLimits) -> None:
    if chars > limits.max_chars:
        raise ExtractionError(
            f"This file holds more than {limits.max_chars:,} characters of text, the limit. Split it into smaller files."
        )


def _check_page_count(count: int, limits: ExtractionLimits) -> None:
    if count > limits.max_pages:
        raise ExtractionError(f"This file has {count} pages; the limit is {limits.max_pages}.")
