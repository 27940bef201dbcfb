"""documents/extraction.py: bytes in, text per page out; every failure is an ExtractionError."""

from __future__ import annotations

import random

import pytest

from documents.extraction import ExtractedDocument, ExtractionError, extract_pages
from tests.pdfs import CONTRACT_PAGES, make_pdf


@pytest.fixture(scope="module")
def contract_pdf() -> bytes:
    return make_pdf(CONTRACT_PAGES, title="Services Agreement")


def _self_referencing_length_pdf() -> bytes:
    """A small, well-formed-looking PDF whose content stream's /Length refers to the stream itself.

    Hand-built with a correct xref table, so that only the self-reference is wrong.
    """
    content = b"BT /F1 11 Tf 72 740 Td (Hello world) Tj ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length 4 0 R >>\nstream\n" + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_good_pdf_gives_one_text_per_page_in_order(contract_pdf):
    document = extract_pages(contract_pdf, filename="contract.pdf")
    assert isinstance(document, ExtractedDocument)
    assert len(document.pages) == 3
    assert "SERVICES AGREEMENT" in document.pages[0]
    assert "Northwind" in document.pages[0]
    assert "4,800 pounds" in document.pages[1]
    assert "90 days" in document.pages[1]
    assert "Confidentiality" in document.pages[2]
    assert "capped" in document.pages[2]
    # Each page holds only its own words.
    assert "4,800" not in document.pages[0]
    assert "Confidentiality" not in document.pages[1]
    assert "Northwind" not in document.pages[2]
    assert document.has_text


def test_good_pdf_title_from_metadata(contract_pdf):
    assert extract_pages(contract_pdf, filename="contract.pdf").title == "Services Agreement"


def test_pdf_without_title_has_none():
    assert extract_pages(make_pdf(["Just one page of text."]), filename="a.pdf").title is None


def test_page_texts_are_stripped(contract_pdf):
    for page in extract_pages(contract_pdf).pages:
        assert page == page.strip()


def test_magic_number_decides_not_the_filename(contract_pdf):
    # A real PDF with a misleading name is still read.
    document = extract_pages(contract_pdf, filename="contract.docx")
    assert len(document.pages) == 3


def test_blank_page_among_text_pages_is_kept_as_empty_string():
    document = extract_pages(make_pdf(["First page words.", "", "Third page words."]), filename="a.pdf")
    assert len(document.pages) == 3
    assert document.pages[1] == ""
    assert "Third page" in document.pages[2]


def test_password_protected_pdf_is_refused():
    data = make_pdf(CONTRACT_PAGES, password="hunter2")
    with pytest.raises(ExtractionError, match="password"):
        extract_pages(data, filename="locked.pdf")


def test_all_blank_pages_means_no_text_and_mentions_ocr():
    data = make_pdf(["", "", ""])
    with pytest.raises(ExtractionError) as excinfo:
        extract_pages(data, filename="scan.pdf")
    message = str(excinfo.value)
    assert "No text" in message
    assert "OCR" in message


def test_non_pdf_bytes_named_pdf_are_not_a_pdf():
    with pytest.raises(ExtractionError, match="not a PDF"):
        extract_pages(b"PK\x03\x04 this is really a zip file" * 10, filename="report.PDF")


def test_non_pdf_bytes_with_other_name_mention_supported_format():
    with pytest.raises(ExtractionError, match="supported format"):
        extract_pages(b"hello, plain text", filename="notes.txt")


def test_empty_bytes_are_refused():
    with pytest.raises(ExtractionError, match="empty"):
        extract_pages(b"", filename="empty.pdf")


def test_truncated_pdf_is_damaged(contract_pdf):
    with pytest.raises(ExtractionError, match="damaged"):
        extract_pages(contract_pdf[:300], filename="truncated.pdf")


def test_max_pages_limit(contract_pdf):
    with pytest.raises(ExtractionError) as excinfo:
        extract_pages(contract_pdf, filename="contract.pdf", max_pages=2)
    assert "3 pages" in str(excinfo.value)
    assert "limit is 2" in str(excinfo.value)


def test_max_pages_equal_to_count_is_allowed(contract_pdf):
    assert len(extract_pages(contract_pdf, max_pages=3).pages) == 3


def test_nul_and_control_characters_are_removed():
    data = make_pdf(["Before\x00after and a bell\x07 here\tand a tab", "Second\x00page"])
    document = extract_pages(data, filename="nul.pdf")
    for page in document.pages:
        assert "\x00" not in page
        assert "\x07" not in page
    assert "Beforeafter" in document.pages[0]
    assert "\t" in document.pages[0]  # tabs survive
    assert "Secondpage" in document.pages[1]


def test_nul_never_in_output_of_contract(contract_pdf):
    assert all("\x00" not in page for page in extract_pages(contract_pdf).pages)


def test_self_referencing_object_is_damaged_not_a_crash():
    """A loop in the object graph makes pypdf raise LimitReachedError (a PyPdfError that is not a
    PdfReadError). The module promises that nothing but ExtractionError escapes."""
    with pytest.raises(ExtractionError, match="damaged"):
        extract_pages(_self_referencing_length_pdf(), filename="loop.pdf")


def _mutations(good: bytes, count: int):
    for seed in range(count):
        rng = random.Random(seed)
        data = bytearray(good)
        kind = seed % 3
        if kind == 0:  # flip a few bytes
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:  # truncate
            data = data[: rng.randrange(1, len(data))]
        else:  # cut a slice out of the middle
            start = rng.randrange(len(data))
            del data[start : start + rng.randint(1, 200)]
        yield seed, bytes(data)


def test_mutated_pdfs_give_a_document_or_an_extraction_error(contract_pdf):
    outcomes = {"document": 0, "error": 0}
    for seed, data in _mutations(contract_pdf, 50):
        try:
            result = extract_pages(data, filename="mutated.pdf")
        except ExtractionError as exc:
            assert str(exc), f"seed {seed}: an ExtractionError needs a message"
            outcomes["error"] += 1
        except Exception as exc:  # anything else escaping is the failure this test looks for
            pytest.fail(f"seed {seed}: {type(exc).__name__} escaped extract_pages: {exc!r}")
        else:
            assert isinstance(result, ExtractedDocument), f"seed {seed}"
            assert result.has_text, f"seed {seed}: a document without text must be an error"
            assert all("\x00" not in page for page in result.pages), f"seed {seed}"
            outcomes["document"] += 1
    # The mutations really exercise both outcomes (otherwise the loop proves little).
    assert outcomes["document"] > 0
    assert outcomes["error"] > 0
