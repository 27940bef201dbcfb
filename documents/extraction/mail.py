"""E-mail (.eml, the stdlib ``email``): the headers a reader needs, the body (HTML made text), and
the attachments, read later as documents of their own."""

from __future__ import annotations

import logging
import re
from email.message import EmailMessage
from html.parser import HTMLParser
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from documents.extraction.base import (
    _SURROGATES,
    KIND_EMAIL,
    Attachment,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    _check_chars,
    undo_surrogate_escapes,
)
from documents.extraction.text import clean_text, paginate

if TYPE_CHECKING:
    from collections.abc import Iterator
    from email.message import MIMEPart

logger = logging.getLogger(__name__)


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
        value = undo_surrogate_escapes(raw)
    else:
        try:
            value = message[name]
            value = "" if value is None else str(value)
        except MemoryError:
            raise
        except Exception:  # the stdlib header parser has bugs on hostile input
            value = raw
    return " ".join(clean_text(value).split())


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
        clean_text(undo_surrogate_escapes(name)).replace("\n", " ").replace("\t", " ").replace("\\", "/")
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
