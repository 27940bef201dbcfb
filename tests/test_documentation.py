"""The README and the design document link only to files a clone has.

A link that leaves the repository (the design once lived in ``../shared/``) or names a file
that was moved is broken for every new engineer; this finds it.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target): a target without a scheme, a mail address or only an anchor is a file.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    links = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        links.append(target.split("#", 1)[0])
    return links


def test_relative_links_are_found_as_files():
    assert relative_links("[a](docs/x.md) [b](https://x.org) [c](#top) [d](../y.md#part)") == [
        "docs/x.md",
        "../y.md",
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_resolve(document):
    broken = []
    for target in relative_links(document.read_text(encoding="utf-8")):
        path = (document.parent / target).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert not broken, f"{document.name} links to what a clone does not have: {broken}"


def test_the_readme_links_to_the_design_in_the_repository():
    assert "docs/architecture.md" in relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
