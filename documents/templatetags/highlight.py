"""``{{ text|highlight:query }}``: the text, escaped, with the query's words marked."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()

_WORD = re.compile(r"\w{3,}", re.UNICODE)


@register.filter
def highlight(text: str, query: str) -> str:
    text = text or ""
    words = sorted(set(_WORD.findall(query or "")), key=len, reverse=True)
    if not words:
        return escape(text)
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")", re.IGNORECASE)
    # Split the raw text, escape every piece, and mark the matches: never match inside an
    # entity that escaping made (a query for "amp" must not break "&amp;").
    pieces = pattern.split(text)
    html = "".join(
        f"<mark>{escape(piece)}</mark>" if index % 2 else escape(piece) for index, piece in enumerate(pieces)
    )
    return mark_safe(html)  # noqa: S308 - every piece is escaped; only <mark> is added
