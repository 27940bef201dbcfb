"""Model output as HTML: Markdown rendered, then sanitised. Pure.

A model writes what its prompt leads it to, and a prompt holds documents anyone could have
written, so its output is as untrusted as an upload. Markdown is rendered with raw HTML off
(``<script>`` stays text) and markdown-it's link check (no ``javascript:`` or ``data:`` links),
then the HTML is cleaned again by an allowlist (nh3, the Rust ammonia sanitiser): only these
tags and attributes, links only to http, https and mailto (no relative link: a scheme-relative
``//evil.example`` would otherwise pass as one, and nothing a model writes needs a link into the
appliance), and every link opened without the page's referrer or any hold on this window.
"""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

TAGS = {
    "p", "br", "strong", "em", "code", "pre", "blockquote", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "a", "table", "thead", "tbody", "tr", "th", "td", "del",
}  # fmt: skip
ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "th": {"align"}, "td": {"align"}}
URL_SCHEMES = {"http", "https", "mailto"}

_markdown = (
    MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    .enable("table")
    .enable("strikethrough")
)


def render_markdown(text: str) -> str:
    """Safe HTML for ``text`` (Markdown from a model or a document)."""
    html = _markdown.render(text or "")
    return nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        url_relative="deny",
        strip_comments=True,
    )
