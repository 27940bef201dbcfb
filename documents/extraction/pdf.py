"""PDF (pypdf): the text layer of every page; a page that is only an image goes to OCR when an
engine is given, else it is marked as needing OCR."""

from __future__ import annotations

import io
import logging
import re
from typing import TYPE_CHECKING, Any

from documents.extraction.base import (
    KIND_PDF,
    PDF_LOCKED_MESSAGE,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    _check_chars,
)
from documents.extraction.text import clean_text
from documents.ocr import OcrError

if TYPE_CHECKING:
    from pypdf import PageObject, PdfReader

    from documents.ocr import OcrEngine

logger = logging.getLogger(__name__)


def _extract_pdf(data: bytes, *, limits: ExtractionLimits, ocr: OcrEngine | None) -> ExtractedDocument:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, LimitReachedError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            # Many PDFs are "encrypted" with an empty user password only to restrict printing.
            try:
                if not reader.decrypt(""):
                    raise ExtractionError(PDF_LOCKED_MESSAGE)
            except (FileNotDecryptedError, NotImplementedError) as exc:
                raise ExtractionError(PDF_LOCKED_MESSAGE) from exc
        count = len(reader.pages)
        if count == 0:
            raise ExtractionError("This PDF has no pages.")
        if count > limits.max_pages:
            raise ExtractionError(f"This PDF has {count} pages; the limit is {limits.max_pages}.")
        pages = []
        chars = 0
        for index, page in enumerate(reader.pages):
            extracted = _pdf_page(page, index, data=data, ocr=ocr)
            chars += len(extracted.text)
            _check_chars(chars, limits)
            pages.append(extracted)
        title = _pdf_title(reader)
    except (ExtractionError, MemoryError):
        raise
    except FileNotDecryptedError as exc:
        raise ExtractionError(PDF_LOCKED_MESSAGE) from exc
    except LimitReachedError as exc:
        # pypdf stops inflating a stream at its limit (75 MB): a decompression bomb, or a file
        # far larger inside than any document needs.
        logger.info("PDF over a pypdf limit: %r", exc)
        raise ExtractionError(
            "This PDF contains a compressed part that expands to an unreasonable size, so it is not read. "
            "It may be damaged or made to attack the reader."
        ) from exc
    except Exception as exc:  # pypdf raises almost anything on a damaged file
        logger.info("unreadable PDF: %r", exc)
        raise ExtractionError("This PDF is damaged or incomplete and cannot be read.") from exc
    if not any(page.text for page in pages) and not any(page.needs_ocr for page in pages):
        if any(page.ocr for page in pages):
            raise ExtractionError("No text could be found in this PDF, not even by OCR of its scanned pages.")
        raise ExtractionError(
            "No text could be found in this PDF: its pages hold neither text nor scanned images of text."
        )
    return ExtractedDocument(kind=KIND_PDF, pages=pages, title=title)


def _pdf_page(page: PageObject, index: int, *, data: bytes, ocr: OcrEngine | None) -> ExtractedPage:
    text = clean_text(page.extract_text() or "").strip()
    if text or not _pdf_page_has_images(page):
        return ExtractedPage(text=text)  # a page of text, or a blank page
    if ocr is None:
        return ExtractedPage(text="", needs_ocr=True)
    try:
        text = clean_text(ocr.ocr_pdf_page(data, index)).strip()
    except OcrError as exc:
        logger.warning("OCR of page %d failed: %s", index + 1, exc)
        return ExtractedPage(text="", needs_ocr=True)
    return ExtractedPage(text=text, ocr=True)


def _pdf_page_has_images(page: PageObject) -> bool:
    """Whether a page without a text layer shows a picture (a scan) rather than nothing."""
    if _pdf_resources_have_images(page.get("/Resources"), depth=0):
        return True
    contents = page.get_contents()
    return contents is not None and re.search(rb"(?:^|\s)BI\s", contents.get_data()) is not None  # inline image


def _pdf_resources_have_images(resources: Any, *, depth: int) -> bool:
    from pypdf.generic import DictionaryObject

    resources = resources.get_object() if resources is not None else None
    if not isinstance(resources, DictionaryObject) or depth > 8:
        return False
    xobjects = resources.get("/XObject")
    xobjects = xobjects.get_object() if xobjects is not None else None
    if not isinstance(xobjects, DictionaryObject):
        return False
    for reference in xobjects.values():
        xobject = reference.get_object()
        if not isinstance(xobject, DictionaryObject):
            continue
        if xobject.get("/Subtype") == "/Image":
            return True
        if xobject.get("/Subtype") == "/Form" and _pdf_resources_have_images(
            xobject.get("/Resources"), depth=depth + 1
        ):
            return True
    return False


def _pdf_title(reader: PdfReader) -> str | None:
    try:
        if reader.metadata and reader.metadata.title:
            return clean_text(str(reader.metadata.title)).strip() or None
    except MemoryError:
        raise
    except Exception:  # broken metadata is no reason to lose the text
        return None
    return None
