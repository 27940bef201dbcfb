"""Files -> text per page. Pure: bytes in, pages out, no ORM and no I/O beyond the arguments
(the one exception is OCR, which the caller hands in as an engine that runs external programs).

The format is decided by the CONTENT (magic bytes, structure); the file name and content type are
only hints. Every way a file can be unusable ends in ``ExtractionError`` with a message a person
understands. ``MemoryError`` is deliberately let through: the sandbox (``documents.sandbox``)
turns it into a message about the memory limit.

Formats: PDF (pypdf), Word .docx (zipfile + expat, no python-docx), plain text, Markdown and
e-mail (.eml, stdlib ``email``). A "page" of a format without pages (text, e-mail, a .docx without
page breaks) is a run of about ``TEXT_PAGE_CHARS`` characters cut at a paragraph or line break, so
that a quote can still be traced to a place in the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from documents.extraction.base import (
    DEFAULT_LIMITS,
    DOCX_LOCKED_MESSAGE,
    KIND_DOCX,
    KIND_EMAIL,
    KIND_MARKDOWN,
    KIND_PDF,
    KIND_TEXT,
    MAX_DOCX_CORE_BYTES,
    MAX_ZIP_MEMBERS,
    NOT_A_DOCX_MESSAGE,
    OLE2_MAGIC,
    PDF_LOCKED_MESSAGE,
    PDF_MAGIC,
    SUPPORTED_FORMATS,
    TEXT_PAGE_CHARS,
    ZIP_MAGICS,
    Attachment,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    _check_chars,
    page_offsets,
)
from documents.extraction.detect import detect_kind
from documents.extraction.docx import _extract_docx
from documents.extraction.mail import _extract_email, html_to_text
from documents.extraction.pdf import _extract_pdf
from documents.extraction.text import _extract_text, clean_text, decode_text, paginate

if TYPE_CHECKING:
    from documents.ocr import OcrEngine

__all__ = [
    "Attachment",
    "DEFAULT_LIMITS",
    "DOCX_LOCKED_MESSAGE",
    "ExtractedDocument",
    "ExtractedPage",
    "ExtractionError",
    "ExtractionLimits",
    "KIND_DOCX",
    "KIND_EMAIL",
    "KIND_MARKDOWN",
    "KIND_PDF",
    "KIND_TEXT",
    "MAX_DOCX_CORE_BYTES",
    "MAX_ZIP_MEMBERS",
    "NOT_A_DOCX_MESSAGE",
    "OLE2_MAGIC",
    "PDF_LOCKED_MESSAGE",
    "PDF_MAGIC",
    "SUPPORTED_FORMATS",
    "TEXT_PAGE_CHARS",
    "ZIP_MAGICS",
    "clean_text",
    "decode_text",
    "detect_kind",
    "extract",
    "extract_pages",
    "html_to_text",
    "page_offsets",
    "paginate",
]


def extract(
    data: bytes,
    *,
    filename: str = "",
    content_type: str = "",
    limits: ExtractionLimits = DEFAULT_LIMITS,
    ocr: OcrEngine | None = None,
) -> ExtractedDocument:
    """The text of every page of ``data``. Raises ExtractionError (and only that, or MemoryError)."""
    if not data:
        raise ExtractionError("The file is empty.")
    kind = detect_kind(data, filename=filename, content_type=content_type)
    if kind == KIND_PDF:
        document = _extract_pdf(data, limits=limits, ocr=ocr)
    elif kind == KIND_DOCX:
        document = _extract_docx(data, limits=limits)
    elif kind == KIND_EMAIL:
        document = _extract_email(data, limits=limits)
    else:
        document = _extract_text(data, kind=kind, limits=limits)
    _check_chars(sum(len(page.text) for page in document.pages), limits)
    return document


def extract_pages(data: bytes, *, filename: str = "", max_pages: int = 5000) -> ExtractedDocument:
    """The first version's entry point, kept for callers not moved to ``extract`` yet."""
    return extract(data, filename=filename, limits=ExtractionLimits(max_pages=max_pages))
