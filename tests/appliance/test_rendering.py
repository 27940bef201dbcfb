"""appliance/rendering.py: model output is rendered as Markdown and nothing from it executes."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from appliance.rendering import ATTRIBUTES, TAGS, render_markdown


class Elements(HTMLParser):
    """Every element and attribute in a piece of HTML, as a browser would see them."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))


def test_markdown_is_rendered():
    html = render_markdown(
        "## Terms\n\n- **Rent**: 1,850 euros *a month*\n- Notice: 3 months\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    )
    assert "<h2>Terms</h2>" in html
    assert "<li><strong>Rent</strong>: 1,850 euros <em>a month</em></li>" in html
    assert "<table>" in html and "<td>2</td>" in html


@pytest.mark.parametrize(
    "hostile",
    [
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "[click](javascript:alert(1))",
        "[click](JaVaScRiPt:alert(1))",
        "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        '<a href="https://example.org" onclick="alert(1)">x</a>',
        "<iframe src='https://example.org'></iframe>",
        '<svg onload="alert(1)">',
        "<style>body{display:none}</style>",
        "[home](//evil.example/login)",  # scheme-relative: another site, on this page's scheme
        '<a href="//evil.example">x</a>',
        "[back](/\\evil.example)",
        "[admin](/admin/auth/user/)",  # a link into the appliance itself
    ],
)
def test_nothing_from_the_model_executes(hostile):
    html = render_markdown(f"Before.\n\n{hostile}\n\nAfter.")
    for tag, attributes in Elements(html).found:
        assert tag in TAGS, html
        assert set(attributes) <= ATTRIBUTES.get(tag, set()) | {"rel"}, html
        href = attributes.get("href") or ""
        assert not href or href.split(":", 1)[0].lower() in {"http", "https", "mailto"}, html
    assert "Before." in html and "After." in html  # the rest of the answer is kept


def test_links_that_stay_are_safe_ones():
    html = render_markdown("See [the council](https://example.org/minutes) or [mail](mailto:clerk@example.org).")
    assert '<a href="https://example.org/minutes" rel="noopener noreferrer nofollow">the council</a>' in html
    assert 'href="mailto:clerk@example.org"' in html
