"""Word .docx (zipfile + expat, no python-docx): the body's paragraphs and tables, its page breaks,
the title; archives checked against zip bombs and XML declarations refused."""

from __future__ import annotations

import io
import logging
import zipfile
from typing import TYPE_CHECKING, NoReturn
from xml.parsers import expat

from documents.extraction.base import (
    _DOCX_ERRORS,
    DOCX_LOCKED_MESSAGE,
    KIND_DOCX,
    MAX_DOCX_CORE_BYTES,
    MAX_ZIP_MEMBERS,
    NOT_A_DOCX_MESSAGE,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    _check_chars,
    _check_page_count,
)
from documents.extraction.text import clean_text, paginate

if TYPE_CHECKING:
    from collections.abc import Iterator

logger = logging.getLogger(__name__)


_WORD_NAMESPACES = {
    "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "http://purl.oclc.org/ooxml/wordprocessingml/main",  # "strict" Office Open XML
}


_MARKUP_COMPATIBILITY = "http://schemas.openxmlformats.org/markup-compatibility/2006"


_DUBLIN_CORE = "http://purl.org/dc/elements/1.1/"


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
