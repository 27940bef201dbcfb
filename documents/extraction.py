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

import io
import logging
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from email.message import EmailMessage
from html.parser import HTMLParser
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, NoReturn
from xml.parsers import expat

from documents.ocr import OcrError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from email.message import MIMEPart

    from pypdf import PageObject, PdfReader

    from documents.ocr import OcrEngine

logger = logging.getLogger(__name__)

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
_SURROGATES = re.compile(r"[\ud800-\udfff]")
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

_WORD_NAMESPACES = {
    "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "http://purl.oclc.org/ooxml/wordprocessingml/main",  # "strict" Office Open XML
}
_MARKUP_COMPATIBILITY = "http://schemas.openxmlformats.org/markup-compatibility/2006"
_DUBLIN_CORE = "http://purl.org/dc/elements/1.1/"

_EMAIL_KEY_HEADERS = {"from", "to", "cc", "subject", "date", "mime-version", "message-id", "received", "return-path"}
_HEADER_LINE = re.compile(rb"^[!-9;-~]+:")  # RFC 5322 field name: printable ASCII except ":"


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


def page_offsets(pages: list[str], separator: str = "\n\n") -> list[int]:
    """Where each page starts in ``separator.join(pages)`` (Page.char_start)."""
    offsets = []
    position = 0
    for text in pages:
        offsets.append(position)
        position += len(text) + len(separator)
    return offsets


# --- which format ------------------------------------------------------------------------------


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


def _unsupported(hint: str = "") -> NoReturn:
    message = f"This file is not a supported format ({SUPPORTED_FORMATS})"
    raise ExtractionError(f"{message}; {hint}." if hint else f"{message}.")


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


# --- PDF -----------------------------------------------------------------------------------------


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


# --- text and Markdown ---------------------------------------------------------------------------


def _extract_text(data: bytes, *, kind: str, limits: ExtractionLimits) -> ExtractedDocument:
    text = decode_text(data)
    if "\f" in text:
        # Form feeds are the page breaks of text files (pdftotext and printers write them).
        pages = [clean_text(part).strip() for part in text.split("\f")]
        while pages and not pages[-1]:
            pages.pop()
        _check_page_count(len(pages), limits)
    else:
        pages = paginate(clean_text(text))
    if not any(pages):
        raise ExtractionError("No text could be found in this file: it holds only blank space.")
    title = _markdown_title(pages[0]) if kind == KIND_MARKDOWN else None
    return ExtractedDocument(kind=kind, pages=[ExtractedPage(text=page) for page in pages], title=title)


def decode_text(data: bytes) -> str:
    """Bytes of a text file -> str: UTF-8 (BOM or not), UTF-16/32 with a BOM, else a best guess.

    Raises ExtractionError when the bytes are not text at all."""
    for bom, encoding in (
        (b"\xff\xfe\x00\x00", "utf-32-le"),
        (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xef\xbb\xbf", "utf-8"),
        (b"\xff\xfe", "utf-16-le"),
        (b"\xfe\xff", "utf-16-be"),
    ):
        if data.startswith(bom):
            text = data[len(bom) :].decode(encoding, errors="replace")
            break
    else:
        if data[:8192].count(0) > 8:
            # Text in any 8-bit or multi-byte encoding has no NUL bytes (a stray one is removed
            # later); UTF-16 without a BOM has one in every other byte. Anything else with NULs is
            # binary (git decides much the same way).
            wide = _utf16_without_bom(data)
            if wide is None:
                _unsupported()
            text = data.decode(wide, errors="replace")
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = _guess_and_decode(data)
    if _looks_binary(text):
        _unsupported()
    return text


def _utf16_without_bom(data: bytes) -> str | None:
    sample = data[: 8192 - 8192 % 2]
    half = len(sample) // 2
    zeros_even, zeros_odd = sample[0::2].count(0), sample[1::2].count(0)
    if zeros_odd > 0.4 * half and zeros_even < 0.05 * half:
        return "utf-16-le"
    if zeros_even > 0.4 * half and zeros_odd < 0.05 * half:
        return "utf-16-be"
    return None


# Code pages of DOS, EBCDIC and the classic Mac: charset-normalizer often names one of these for
# short text, but a file uploaded today is hardly ever in one of them.
_UNLIKELY_ENCODINGS = {
    "cp037", "cp273", "cp424", "cp437", "cp500", "cp737", "cp775", "cp850", "cp852", "cp855", "cp856",
    "cp857", "cp858", "cp860", "cp861", "cp862", "cp863", "cp864", "cp865", "cp866", "cp869", "cp875",
    "cp1006", "cp1026", "cp1125", "cp1140", "hp_roman8",
}  # fmt: skip


def _guess_and_decode(data: bytes) -> str:
    import charset_normalizer

    best = None
    try:
        matches = [
            match
            for match in charset_normalizer.from_bytes(data)
            # Without a BOM and without NULs, a "UTF-16" guess is a coincidence of an even length.
            if not match.encoding.startswith(("utf_16", "utf_32"))
        ]
    except (ValueError, LookupError, UnicodeError, TypeError) as exc:  # a guess, never a reason to fail
        logger.info("charset guess failed: %r", exc)
        matches = []
    likely = [
        match
        for match in matches
        if match.encoding not in _UNLIKELY_ENCODINGS and not match.encoding.startswith("mac_")
    ]
    matches = likely or matches
    if matches:
        chaos = min(match.chaos for match in matches)
        calm = [match for match in matches if match.chaos == chaos]
        coherence = max(match.coherence for match in calm)
        best_matches = [match for match in calm if match.coherence == coherence]
        best = best_matches[0].encoding
        # On short Western text the guess is a coin toss between Windows code pages that decode
        # it equally well; Windows-1252 is by far the most likely of them.
        if any("cp1252" in match.could_be_from_charset for match in best_matches):
            best = "cp1252"
    try:
        return data.decode(best or "cp1252", errors="replace")
    except LookupError:
        return data.decode("cp1252", errors="replace")


def _looks_binary(text: str) -> bool:
    """Many control characters: not text (a few stray ones in a short note are only removed)."""
    sample = text[:65536]
    return len(_NOT_TEXT_CHARS.findall(sample)) > max(8, _BINARY_RATIO * len(sample))


def clean_text(text: str) -> str:
    """Line ends normalised to \\n; NUL and other control characters (except \\n and \\t) removed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL_CHARS.sub("", text)


def paginate(text: str, page_chars: int = TEXT_PAGE_CHARS) -> list[str]:
    """Text without pages -> "pages" of about ``page_chars``, cut at a paragraph, line or word break."""
    pages = []
    start = 0
    while len(text) - start > page_chars:
        end = start + page_chars
        earliest = start + page_chars // 2
        cut = -1
        for boundary in ("\n\n", "\n", " "):
            cut = text.rfind(boundary, earliest, end)
            if cut != -1:
                break
        if cut == -1:
            cut = end
        pages.append(text[start:cut])
        start = cut
    pages.append(text[start:])
    return [page.strip() for page in pages if page.strip()]


def _markdown_title(first_page: str) -> str | None:
    for line in first_page.splitlines()[:20]:
        match = re.match(r"#\s+(.+?)\s*#*\s*$", line)
        if match:
            return match.group(1)[:255]
    return None


# --- Word .docx ----------------------------------------------------------------------------------


def _extract_docx(data: bytes, *, limits: ExtractionLimits) -> ExtractedDocument:
    damaged = "This Word document is damaged or incomplete and cannot be read."
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = _checked_zip_members(archive, limits)
            body = _DocxBody(limits)
            body.parse(_read_zip_member(archive, members["word/document.xml"], limits))
            title = None
            if "docProps/core.xml" in members:
                title = _docx_title(archive, members["docProps/core.xml"])
    except (ExtractionError, MemoryError):
        raise
    except _DOCX_ERRORS as exc:
        logger.info("unreadable .docx: %r", exc)
        raise ExtractionError(damaged) from exc
    text = body.text()
    if "\f" in text:
        # Explicit page breaks and Word's record of where it last broke pages: real pages.
        pages = [page for page in (clean_text(part).strip() for part in text.split("\f")) if page]
        _check_page_count(len(pages), limits)
    else:
        pages = paginate(clean_text(text))
    if not pages:
        raise ExtractionError("No text could be found in this Word document (it may hold only pictures).")
    return ExtractedDocument(kind=KIND_DOCX, pages=[ExtractedPage(text=page) for page in pages], title=title)


def _checked_zip_members(archive: zipfile.ZipFile, limits: ExtractionLimits) -> dict[str, zipfile.ZipInfo]:
    """The members by name, after refusing encrypted archives and zip bombs (declared sizes;
    the actual sizes are enforced again while reading, as a header can lie)."""
    infos = archive.infolist()
    if len(infos) > MAX_ZIP_MEMBERS:
        raise ExtractionError(f"This Word document holds {len(infos)} files inside; the limit is {MAX_ZIP_MEMBERS}.")
    total = 0
    for info in infos:
        if info.flag_bits & 0x1:
            raise ExtractionError(DOCX_LOCKED_MESSAGE)
        total += info.file_size
        if info.file_size > limits.max_uncompressed_bytes or total > limits.max_uncompressed_bytes:
            raise _zip_bomb_error(limits)
    members = {info.filename: info for info in infos}
    if "word/document.xml" not in members:
        raise ExtractionError(NOT_A_DOCX_MESSAGE)
    return members


def _zip_bomb_error(limits: ExtractionLimits) -> ExtractionError:
    megabytes = limits.max_uncompressed_bytes // (1024 * 1024)
    return ExtractionError(
        f"This Word document expands to more than {megabytes} MB when unpacked, so it is not read. "
        "It may be damaged or made to attack the reader."
    )


def _read_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limits: ExtractionLimits) -> Iterator[bytes]:
    read = 0
    with archive.open(info) as handle:
        while chunk := handle.read(256 * 1024):
            read += len(chunk)
            if read > limits.max_uncompressed_bytes:
                raise _zip_bomb_error(limits)
            yield chunk


def _safe_expat_parser() -> expat.XMLParserType:
    """An expat parser that refuses any DOCTYPE, so no entity can be declared (billion laughs,
    external entities). Word never writes one."""
    parser = expat.ParserCreate(namespace_separator=" ")

    def refuse(*args: object) -> NoReturn:
        raise ExtractionError(
            "This Word document contains XML declarations (DOCTYPE or ENTITY) that Word never writes; "
            "it is not read, as it may be made to attack the reader."
        )

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.buffer_text = True
    return parser


class _DocxBody:
    """word/document.xml -> text, streamed through expat: paragraphs one per line, table rows as
    "cell | cell", "\\f" at page breaks. Only w:t is text (not deleted text, not field codes), and
    the fallback copy of mc:AlternateContent is skipped so that text boxes are not read twice."""

    _PAGE_BREAK = "\f"

    def __init__(self, limits: ExtractionLimits):
        self.limits = limits
        self.chars = 0
        self.blocks: list[str] = []
        self.containers: list[list[str]] = [self.blocks]  # the body, or the table cell we are in
        self.rows: list[list[str]] = []
        self.paragraphs: list[list[str]] = []
        self.elements: list[str] = []  # local names of the open Word elements
        self.in_text = 0
        self.skip_depth = 0

    def parse(self, chunks: Iterator[bytes]) -> None:
        parser = _safe_expat_parser()
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._characters
        for chunk in chunks:
            parser.Parse(chunk, False)
        parser.Parse(b"", True)

    def text(self) -> str:
        return "\n".join(self.blocks)

    @staticmethod
    def _split(name: str) -> tuple[str, str]:
        namespace, _, local = name.rpartition(" ")
        return namespace, local

    def _start(self, name: str, attributes: dict[str, str]) -> None:
        if self.skip_depth:
            self.skip_depth += 1
            return
        namespace, local = self._split(name)
        if namespace == _MARKUP_COMPATIBILITY and local == "Fallback":
            self.skip_depth = 1
            return
        if namespace not in _WORD_NAMESPACES:
            self.elements.append("")
            return
        parent = self.elements[-1] if self.elements else ""
        self.elements.append(local)
        if local == "p":
            self.paragraphs.append([])
        elif local == "t":
            self.in_text += 1
        elif local == "tc":
            self.containers.append([])
        elif local == "tr":
            self.rows.append([])
        elif self.paragraphs and parent == "r":
            if local == "tab":
                self.paragraphs[-1].append("\t")
            elif local in {"br", "cr"}:
                kind = next((value for key, value in attributes.items() if self._split(key)[1] == "type"), "")
                self.paragraphs[-1].append(self._PAGE_BREAK if kind == "page" else "\n")
            elif local == "lastRenderedPageBreak":
                self.paragraphs[-1].append(self._PAGE_BREAK)
            elif local == "noBreakHyphen":
                self.paragraphs[-1].append("-")
        elif local == "pageBreakBefore" and self.paragraphs:
            value = next((value for key, value in attributes.items() if self._split(key)[1] == "val"), "true")
            if value.lower() not in {"0", "false", "off"}:
                self.paragraphs[-1].insert(0, self._PAGE_BREAK)

    def _end(self, name: str) -> None:
        if self.skip_depth:
            self.skip_depth -= 1
            return
        if not self.elements:
            return
        local = self.elements.pop()
        if local == "p" and self.paragraphs:
            self.containers[-1].append("".join(self.paragraphs.pop()))
        elif local == "t":
            self.in_text -= 1
        elif local == "tc" and len(self.containers) > 1:
            cell = self.containers.pop()
            if self.rows:
                self.rows[-1].append(" ".join(part.strip() for part in cell if part.strip()))
        elif local == "tr" and self.rows:
            cells = self.rows.pop()
            if any(cells):
                self.containers[-1].append(" | ".join(cells))

    def _characters(self, data: str) -> None:
        if self.in_text > 0 and self.paragraphs and not self.skip_depth:
            self.chars += len(data)
            _check_chars(self.chars, self.limits)
            self.paragraphs[-1].append(data)


def _docx_title(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> str | None:
    """dc:title from docProps/core.xml; a broken or oversized core.xml only costs the title."""
    if info.file_size > MAX_DOCX_CORE_BYTES:
        return None
    parts: list[str] = []
    depth = 0

    def start(name: str, attributes: dict[str, str]) -> None:
        nonlocal depth
        if name == f"{_DUBLIN_CORE} title" or depth:
            depth += 1

    def end(name: str) -> None:
        nonlocal depth
        if depth:
            depth -= 1

    def characters(data: str) -> None:
        if depth:
            parts.append(data)

    parser = _safe_expat_parser()
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    try:
        with archive.open(info) as handle:
            parser.Parse(handle.read(MAX_DOCX_CORE_BYTES + 1), True)
    except MemoryError:
        raise
    except Exception as exc:
        logger.info("unreadable docProps/core.xml: %r", exc)
        return None
    return clean_text("".join(parts)).strip()[:255] or None


# --- e-mail --------------------------------------------------------------------------------------


def _extract_email(data: bytes, *, limits: ExtractionLimits) -> ExtractedDocument:
    try:
        return _read_email(data, limits=limits)
    except (ExtractionError, MemoryError):
        raise
    except Exception as exc:  # the stdlib e-mail parser is lenient, but not bug-free on hostile input
        logger.warning("unreadable e-mail: %r", exc)
        raise ExtractionError("This e-mail is damaged and cannot be read.") from exc


def _read_email(data: bytes, *, limits: ExtractionLimits) -> ExtractedDocument:
    from email import policy
    from email.parser import BytesParser

    message = BytesParser(policy=policy.default).parsebytes(data)
    subject = _header(message, "Subject")
    body_part = _email_body_part(message)
    attachments = _email_attachments(message, body_part=body_part, limits=limits)

    lines = [
        f"{name}: {value}" for name in ("From", "To", "Cc", "Date", "Subject") if (value := _header(message, name))
    ]
    if attachments:
        lines.append("Attachments: " + ", ".join(attachment.filename for attachment in attachments))
    body = _email_body_text(body_part) if body_part is not None else ""
    text = clean_text("\n".join(lines) + "\n\n" + body)
    _check_chars(len(text), limits)
    pages = paginate(text)
    if not pages:
        raise ExtractionError("No text could be found in this e-mail: it has no headers, body or attachments.")
    return ExtractedDocument(
        kind=KIND_EMAIL,
        pages=[ExtractedPage(text=page) for page in pages],
        title=subject[:255] or None,
        attachments=attachments,
    )


def _header(message: EmailMessage, name: str) -> str:
    """A header's decoded value on one line; a header too broken to decode is given raw."""
    raw = next((str(value) for key, value in message.raw_items() if key.lower() == name.lower()), "")
    if _SURROGATES.search(raw):
        # Raw 8-bit bytes (against the RFC, but common) that the parser would turn into "\ufffd".
        value = _undo_surrogate_escapes(raw)
    else:
        try:
            value = message[name]
            value = "" if value is None else str(value)
        except MemoryError:
            raise
        except Exception:  # the stdlib header parser has bugs on hostile input
            value = raw
    return " ".join(clean_text(value).split())


def _undo_surrogate_escapes(value: str) -> str:
    """Raw 8-bit bytes arrive from the e-mail parser as surrogate escapes: decode them as UTF-8,
    else as Windows-1252."""
    if not _SURROGATES.search(value):
        return value
    try:
        raw = value.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return value  # not escapes: clean_text removes them
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def _email_body_part(message: EmailMessage) -> MIMEPart | None:
    try:
        return message.get_body(preferencelist=("plain", "html"))
    except MemoryError:
        raise
    except Exception as exc:
        logger.info("e-mail body not found: %r", exc)
        return None


def _email_body_text(part: MIMEPart) -> str:
    try:
        content = part.get_content()
    except MemoryError:
        raise
    except Exception:  # an unknown charset, a broken transfer encoding: decode what is there
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else ""
    if not isinstance(content, str):
        content = content.decode("utf-8", errors="replace") if isinstance(content, bytes) else ""
    if part.get_content_subtype() == "html":
        content = html_to_text(content)
    return content


def _email_leaf_parts(part: MIMEPart, depth: int = 0) -> Iterator[MIMEPart]:
    """Every part that is not a container; an attached e-mail (message/rfc822) is one part."""
    if depth > 50:
        return
    if part.get_content_type() == "message/rfc822" and depth > 0:
        yield part
    elif part.is_multipart():
        for child in part.iter_parts():
            yield from _email_leaf_parts(child, depth + 1)
    else:
        yield part


def _email_attachments(
    message: EmailMessage, *, body_part: MIMEPart | None, limits: ExtractionLimits
) -> list[Attachment]:
    attachments: list[Attachment] = []
    for part in _email_leaf_parts(message):
        if len(attachments) >= limits.max_attachments:
            logger.info("e-mail has more than %d attachments; the rest are ignored", limits.max_attachments)
            break
        if part is body_part:
            continue
        try:
            filename = part.get_filename()
        except MemoryError:
            raise
        except Exception:
            filename = None
        try:
            if part.get_content_type() == "message/rfc822":
                inner = part.get_payload(0)
                if not isinstance(inner, EmailMessage):  # policy.default parses every part as one
                    raise TypeError(f"an attached message parsed as {type(inner).__name__}")
                data = inner.as_bytes()
                filename = filename or f"{_header(inner, 'Subject') or 'message'}.eml"
            elif filename:
                payload = part.get_payload(decode=True)
                data = payload if isinstance(payload, bytes) else b""
            else:
                continue
        except MemoryError:
            raise
        except Exception as exc:
            logger.info("e-mail attachment unreadable: %r", exc)
            continue
        attachments.append(
            Attachment(
                filename=_safe_filename(filename, len(attachments) + 1),
                data=data,
                content_type=part.get_content_type(),
            )
        )
    return attachments


def _safe_filename(name: str, number: int) -> str:
    """A bare file name: no directories, no control characters, at most 255 characters."""
    name = PurePosixPath(
        clean_text(_undo_surrogate_escapes(name)).replace("\n", " ").replace("\t", " ").replace("\\", "/")
    ).name
    name = name.strip().lstrip(".")
    return name[-255:] if name else f"attachment-{number}"


class _HtmlText(HTMLParser):
    _BLOCK = {
        "address", "article", "blockquote", "br", "dd", "div", "dl", "dt", "footer", "h1", "h2", "h3",
        "h4", "h5", "h6", "header", "hr", "li", "ol", "p", "pre", "section", "table", "tr", "ul",
    }  # fmt: skip
    _HIDDEN = {"head", "script", "style", "template", "noscript"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self.hidden += 1
        elif tag in self._BLOCK:
            self._line_break()
        elif tag in {"td", "th"}:
            self.parts.append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in self._BLOCK:
            self._line_break()

    def _line_break(self) -> None:
        if self.parts and self.parts[-1] != "\n":
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of an HTML e-mail body, one block per line."""
    parser = _HtmlText()
    try:
        parser.feed(html)
        parser.close()
        text = "".join(parser.parts)
    except MemoryError:
        raise
    except Exception as exc:  # html.parser still has corner cases that raise
        logger.info("HTML body unparseable, tags stripped instead: %r", exc)
        text = re.sub(r"<[^>]*>", " ", html)
    lines = (" ".join(line.replace("\xa0", " ").split()) for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


# --- limits --------------------------------------------------------------------------------------


def _check_chars(chars: int, limits: ExtractionLimits) -> None:
    if chars > limits.max_chars:
        raise ExtractionError(
            f"This file holds more than {limits.max_chars:,} characters of text, the limit. Split it into smaller files."
        )


def _check_page_count(count: int, limits: ExtractionLimits) -> None:
    if count > limits.max_pages:
        raise ExtractionError(f"This file has {count} pages; the limit is {limits.max_pages}.")
