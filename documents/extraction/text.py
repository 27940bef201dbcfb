"""Plain text and Markdown: the encoding found (BOM, UTF-16 without one, UTF-8, a guess), control
characters removed, and made-up pages of about ``TEXT_PAGE_CHARS`` characters."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from documents.extraction.base import (
    _BINARY_RATIO,
    _CONTROL_CHARS,
    _NOT_TEXT_CHARS,
    _UNICODE_LINE_ENDS,
    _UNICODE_SPACES,
    KIND_MARKDOWN,
    TEXT_PAGE_CHARS,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    _check_page_count,
    _unsupported,
)

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


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
    """Line ends normalised to \\n, Unicode spaces to " " (``_UNICODE_SPACES``); NUL and other
    control characters (except \\n and \\t) removed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _UNICODE_SPACES.sub(" ", _UNICODE_LINE_ENDS.sub("\n", text))
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
