"""Files -> text per page. Pure: bytes in, pages out, no ORM and no I/O beyond the arguments.

Every way a file can be unusable ends in ``ExtractionError`` with a message a person
understands; nothing else escapes from ``extract_pages``.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PDF_MAGIC = b"%PDF-"


class ExtractionError(Exception):
    """The file cannot be read; the message is shown to the person who uploaded it."""


@dataclass(frozen=True)
class ExtractedDocument:
    pages: list[str]  # page texts, in order; page 1 is pages[0]
    title: str | None = None

    @property
    def has_text(self) -> bool:
        return any(page.strip() for page in self.pages)


def extract_pages(data: bytes, *, filename: str = "", max_pages: int = 5000) -> ExtractedDocument:
    if not data:
        raise ExtractionError("The file is empty.")
    # The magic number decides, not the name: a renamed file must not reach the PDF parser.
    if PDF_MAGIC not in data[:1024]:
        kind = "a PDF" if filename.lower().endswith(".pdf") else "a supported format (PDF)"
        raise ExtractionError(f"This file is not {kind}: its contents do not start like a PDF.")
    return _extract_pdf(data, max_pages=max_pages)


def _extract_pdf(data: bytes, *, max_pages: int) -> ExtractedDocument:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            # Many PDFs are "encrypted" with an empty user password only to restrict printing.
            try:
                if not reader.decrypt(""):
                    raise ExtractionError("This PDF is protected by a password. Remove the password and upload it again.")
            except (FileNotDecryptedError, NotImplementedError) as exc:
                raise ExtractionError(
                    "This PDF is protected by a password. Remove the password and upload it again."
                ) from exc
        count = len(reader.pages)
        if count == 0:
            raise ExtractionError("This PDF has no pages.")
        if count > max_pages:
            raise ExtractionError(f"This PDF has {count} pages; the limit is {max_pages}.")
        pages = [_page_text(page) for page in reader.pages]
        title = None
        try:
            if reader.metadata and reader.metadata.title:
                title = str(reader.metadata.title).strip() or None
        except Exception:  # broken metadata is no reason to lose the text
            title = None
    except ExtractionError:
        raise
    except FileNotDecryptedError as exc:
        raise ExtractionError("This PDF is protected by a password. Remove the password and upload it again.") from exc
    except (PyPdfError, PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OSError) as exc:
        logger.info("unreadable PDF: %r", exc)
        raise ExtractionError("This PDF is damaged or incomplete and cannot be read.") from exc
    document = ExtractedDocument(pages=pages, title=title)
    if not document.has_text:
        raise ExtractionError(
            "No text could be found in this PDF. It may be a scan (an image of text); "
            "scanned documents need OCR, which is not enabled on this appliance."
        )
    return document


def _page_text(page) -> str:
    text = page.extract_text() or ""
    # NUL cannot be stored in a Postgres text column; other control characters are noise.
    return "".join(ch for ch in text if ch in "\n\t" or ch >= " ").strip()
