"""documents/ocr.py: scanned PDF pages read by the real pdftoppm and tesseract (Debian packages
poppler-utils, tesseract-ocr, tesseract-ocr-eng)."""

from __future__ import annotations

import pytest

from documents.extraction import ExtractedPage, extract
from documents.ocr import OcrEngine, OcrError, default_ocr_engine
from tests.pdfs import make_pdf, make_scanned_pdf


@pytest.fixture(scope="module")
def two_scanned_pages() -> bytes:
    return make_scanned_pdf(
        ["Invoice number 4711", "Payment due within thirty days"],
        ["Second page about apples", "and oranges from Valencia"],
    )


def _words(text: str) -> set[str]:
    return {word.strip(".,:;").lower() for word in text.split()}


def test_ocr_programs_are_installed():
    assert OcrEngine.available(), "install Debian's tesseract-ocr, tesseract-ocr-eng and poppler-utils"
    assert isinstance(default_ocr_engine(), OcrEngine)


def test_without_the_programs_there_is_no_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not OcrEngine.available()
    assert default_ocr_engine() is None


def test_ocr_reads_the_words_of_the_page_asked_for(two_scanned_pages):
    engine = OcrEngine()
    first = _words(engine.ocr_pdf_page(two_scanned_pages, 0))
    second = _words(engine.ocr_pdf_page(two_scanned_pages, 1))
    assert {"invoice", "4711", "payment", "thirty"} <= first
    assert {"apples", "oranges", "valencia"} <= second
    assert "apples" not in first
    assert "invoice" not in second


def test_extract_with_the_engine_marks_pages_read_by_ocr(two_scanned_pages):
    document = extract(two_scanned_pages, filename="scan.pdf", ocr=OcrEngine())
    assert [(page.ocr, page.needs_ocr) for page in document.pages] == [(True, False), (True, False)]
    assert "valencia" in _words(document.pages[1].text)
    assert document.has_text


def test_extract_without_an_engine_marks_pages_needing_ocr(two_scanned_pages):
    document = extract(two_scanned_pages, filename="scan.pdf")
    assert document.pages == [ExtractedPage(text="", needs_ocr=True)] * 2


def test_a_page_that_does_not_exist_is_an_ocr_error(two_scanned_pages):
    with pytest.raises(OcrError, match="pdftoppm"):
        OcrEngine().ocr_pdf_page(two_scanned_pages, 5)


def test_a_broken_pdf_is_an_ocr_error():
    with pytest.raises(OcrError):
        OcrEngine().ocr_pdf_page(b"%PDF-1.4 not really", 0)


def test_a_timeout_is_an_ocr_error(two_scanned_pages):
    with pytest.raises(OcrError, match="took longer"):
        OcrEngine().ocr_pdf_page(two_scanned_pages, 0, timeout_s=0.01)


def test_missing_programs_are_an_ocr_error(two_scanned_pages, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(OcrError, match="could not be started"):
        OcrEngine().ocr_pdf_page(two_scanned_pages, 0)


def test_a_page_with_a_text_layer_reads_the_same_by_ocr():
    """OCR of a rendered text page: a check that rendering and reading work on any PDF."""
    data = make_pdf(["Termination requires ninety days written notice."])
    assert {"termination", "ninety", "notice"} <= _words(OcrEngine().ocr_pdf_page(data, 0))
