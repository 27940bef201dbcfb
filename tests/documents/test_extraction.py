"""documents/extraction/: bytes in, text per page out; every failure is an ExtractionError."""

from __future__ import annotations

import io
import random
import zipfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader, PdfWriter

from documents.extraction import (
    TEXT_PAGE_CHARS,
    Attachment,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
    extract,
    extract_pages,
    page_offsets,
)
from documents.ocr import OcrError
from tests.pdfs import (
    CONTRACT_PAGES,
    docx_document_xml,
    docx_paragraph,
    docx_table,
    hand_made_pdf,
    make_docx,
    make_eml,
    make_pdf,
    make_scanned_pdf,
    zlib_bomb,
)

SUPPORTED = "not a supported format (PDF, Word .docx, text, Markdown, e-mail .eml)"
KINDS = {"pdf", "text", "markdown", "docx", "email"}


@pytest.fixture(scope="module")
def contract_pdf() -> bytes:
    return make_pdf(CONTRACT_PAGES, title="Services Agreement")


@pytest.fixture(scope="module")
def scanned_pdf() -> bytes:
    return make_scanned_pdf(["Scanned invoice 4711", "Total due forty pounds"])


def _texts(document: ExtractedDocument) -> list[str]:
    return [page.text for page in document.pages]


def _self_referencing_length_pdf() -> bytes:
    """A small, well-formed-looking PDF whose content stream's /Length refers to the stream itself.

    Hand-built with a correct xref table, so that only the self-reference is wrong.
    """
    content = b"BT /F1 11 Tf 72 740 Td (Hello world) Tj ET"
    return hand_made_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
            b"<< /Length 4 0 R >>\nstream\n" + content + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def _pdf_with_content_stream(stream: bytes, *, filters: bytes = b"/Filter /FlateDecode") -> bytes:
    return hand_made_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
            b"<< /Length %d %s >>\nstream\n" % (len(stream), filters) + stream + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


class FakeOcrEngine:
    """A fake OCR engine (the real one is tested in test_ocr.py): records the pages it was asked
    for and answers with a fixed text, or fails like the real one does."""

    def __init__(self, text: str = "text read by OCR", *, fail: bool = False):
        self.text = text
        self.fail = fail
        self.calls: list[int] = []

    def ocr_pdf_page(self, pdf_data: bytes, page_index: int, *, timeout_s: float = 120) -> str:
        assert pdf_data.startswith(b"%PDF-")
        self.calls.append(page_index)
        if self.fail:
            raise OcrError("tesseract exited with 1")
        return self.text


# --- PDF -----------------------------------------------------------------------------------------


def test_good_pdf_gives_one_text_per_page_in_order(contract_pdf):
    document = extract(contract_pdf, filename="contract.pdf")
    assert isinstance(document, ExtractedDocument)
    assert document.kind == "pdf"
    texts = _texts(document)
    assert len(texts) == 3
    assert "SERVICES AGREEMENT" in texts[0]
    assert "Northwind" in texts[0]
    assert "4,800 pounds" in texts[1]
    assert "90 days" in texts[1]
    assert "Confidentiality" in texts[2]
    assert "capped" in texts[2]
    # Each page holds only its own words.
    assert "4,800" not in texts[0]
    assert "Confidentiality" not in texts[1]
    assert "Northwind" not in texts[2]
    assert document.has_text
    assert all(not page.needs_ocr and not page.ocr for page in document.pages)
    assert document.attachments == []


def test_extract_pages_is_kept_as_a_wrapper(contract_pdf):
    document = extract_pages(contract_pdf, filename="contract.pdf")
    assert _texts(document) == _texts(extract(contract_pdf, filename="contract.pdf"))
    with pytest.raises(ExtractionError, match="limit is 2"):
        extract_pages(contract_pdf, filename="contract.pdf", max_pages=2)


def test_good_pdf_title_from_metadata(contract_pdf):
    assert extract(contract_pdf, filename="contract.pdf").title == "Services Agreement"


def test_pdf_without_title_has_none():
    assert extract(make_pdf(["Just one page of text."]), filename="a.pdf").title is None


def test_page_texts_are_stripped(contract_pdf):
    for text in _texts(extract(contract_pdf)):
        assert text == text.strip()


def test_magic_number_decides_not_the_filename(contract_pdf):
    # A real PDF with a misleading name (or content type) is still read.
    assert len(extract(contract_pdf, filename="contract.docx").pages) == 3
    assert extract(contract_pdf, filename="notes.txt", content_type="text/plain").kind == "pdf"


def test_pdf_header_after_leading_junk_is_still_a_pdf(contract_pdf):
    document = extract(b"\r\n" * 20 + contract_pdf, filename="contract.pdf")
    assert "Northwind" in document.pages[0].text


def test_text_that_mentions_the_pdf_header_is_still_text():
    document = extract(b"# PDF notes\n\nEvery PDF file starts with %PDF-1.7 and holds objects.\n" + b"More. " * 50)
    assert document.kind == "text"


def test_blank_page_among_text_pages_is_kept_empty_and_not_marked_for_ocr():
    document = extract(make_pdf(["First page words.", "", "Third page words."]), filename="a.pdf")
    assert len(document.pages) == 3
    assert document.pages[1] == ExtractedPage(text="", needs_ocr=False, ocr=False)
    assert "Third page" in document.pages[2].text


def test_password_protected_pdf_is_refused():
    data = make_pdf(CONTRACT_PAGES, password="hunter2")
    with pytest.raises(ExtractionError, match="protected by a password"):
        extract(data, filename="locked.pdf")


def test_pdf_encrypted_with_an_empty_user_password_is_read(contract_pdf):
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(contract_pdf)))
    writer.encrypt(user_password="", owner_password="owner-only-restricts-printing")
    buffer = io.BytesIO()
    writer.write(buffer)
    data = buffer.getvalue()
    assert PdfReader(io.BytesIO(data)).is_encrypted
    document = extract(data, filename="restricted.pdf")
    assert "Northwind" in document.pages[0].text


def test_all_blank_pages_means_no_text():
    with pytest.raises(ExtractionError, match="No text could be found in this PDF"):
        extract(make_pdf(["", "", ""]), filename="blank.pdf")


def test_non_pdf_bytes_named_pdf_are_not_a_pdf():
    with pytest.raises(ExtractionError, match="not a PDF"):
        extract(b"PK\x03\x04 this is really a zip file" * 10, filename="report.PDF")


def test_text_named_pdf_is_not_a_pdf_rather_than_read_as_text():
    with pytest.raises(ExtractionError, match="not a PDF"):
        extract(b"Just some notes, saved with the wrong name.", filename="notes.pdf")
    with pytest.raises(ExtractionError, match="not a PDF"):
        extract(b"Just some notes.", filename="upload", content_type="application/pdf")


def test_empty_bytes_are_refused():
    with pytest.raises(ExtractionError, match="empty"):
        extract(b"", filename="empty.pdf")


def test_truncated_pdf_is_damaged(contract_pdf):
    with pytest.raises(ExtractionError, match="damaged"):
        extract(contract_pdf[:300], filename="truncated.pdf")


def test_pdf_with_no_pages_is_refused():
    data = hand_made_pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"])
    with pytest.raises(ExtractionError, match="no pages"):
        extract(data, filename="empty.pdf")


def test_max_pages_limit(contract_pdf):
    with pytest.raises(ExtractionError) as excinfo:
        extract(contract_pdf, filename="contract.pdf", limits=ExtractionLimits(max_pages=2))
    assert "3 pages" in str(excinfo.value)
    assert "limit is 2" in str(excinfo.value)


def test_max_pages_equal_to_count_is_allowed(contract_pdf):
    assert len(extract(contract_pdf, limits=ExtractionLimits(max_pages=3)).pages) == 3


def test_max_chars_limit(contract_pdf):
    with pytest.raises(ExtractionError, match="characters"):
        extract(contract_pdf, limits=ExtractionLimits(max_chars=200))


def test_pdf_decompression_bomb_is_refused_with_a_clear_message():
    """A 2 MB content stream that inflates to 2 GB of zeros: pypdf stops at its limit, and the
    person is told why (the sandbox test checks that memory stays bounded while it does)."""
    bomb = zlib_bomb(2 * 1024**3)
    assert len(bomb) < 3 * 1024 * 1024
    with pytest.raises(ExtractionError, match="expands to an unreasonable size"):
        extract(_pdf_with_content_stream(bomb), filename="bomb.pdf")


def test_small_flate_stream_in_the_same_hand_made_pdf_is_read():
    """The bomb test's PDF is sound apart from the bomb: the same PDF with a real stream reads."""
    import zlib

    stream = zlib.compress(b"BT /F1 11 Tf 72 740 Td (Hello from a deflated stream) Tj ET")
    assert "Hello from a deflated stream" in extract(_pdf_with_content_stream(stream)).pages[0].text


def test_nul_and_control_characters_are_removed():
    data = make_pdf(["Before\x00after and a bell\x07 here\tand a tab", "Second\x00page"])
    texts = _texts(extract(data, filename="nul.pdf"))
    for text in texts:
        assert "\x00" not in text
        assert "\x07" not in text
    assert "Beforeafter" in texts[0]
    assert "\t" in texts[0]  # tabs survive
    assert "Secondpage" in texts[1]


def test_self_referencing_object_is_damaged_not_a_crash():
    """A loop in the object graph makes pypdf raise LimitReachedError (a PyPdfError that is not a
    PdfReadError). The module promises that nothing but ExtractionError escapes."""
    with pytest.raises(ExtractionError):
        extract(_self_referencing_length_pdf(), filename="loop.pdf")


# --- scanned pages -------------------------------------------------------------------------------


def test_scanned_page_without_ocr_is_marked_needs_ocr_and_is_not_an_error(scanned_pdf):
    document = extract(scanned_pdf, filename="scan.pdf")
    assert document.pages == [ExtractedPage(text="", needs_ocr=True, ocr=False)]
    assert not document.has_text


def test_scanned_page_is_read_by_the_ocr_engine_given(scanned_pdf):
    engine = FakeOcrEngine("Scanned invoice 4711")
    document = extract(scanned_pdf, filename="scan.pdf", ocr=engine)
    assert engine.calls == [0]
    assert document.pages == [ExtractedPage(text="Scanned invoice 4711", needs_ocr=False, ocr=True)]


def test_ocr_is_asked_only_for_pages_without_text_that_show_an_image():
    text_pdf = PdfReader(io.BytesIO(make_pdf(["A page of real text.", ""])))
    scan = PdfReader(io.BytesIO(make_scanned_pdf(["Scanned page"])))
    writer = PdfWriter()
    writer.add_page(text_pdf.pages[0])  # index 0: text
    writer.add_page(scan.pages[0])  # index 1: a scan
    writer.add_page(text_pdf.pages[1])  # index 2: blank
    buffer = io.BytesIO()
    writer.write(buffer)
    engine = FakeOcrEngine("words from the scan")
    document = extract(buffer.getvalue(), ocr=engine)
    assert engine.calls == [1]
    assert [(page.text, page.needs_ocr, page.ocr) for page in document.pages] == [
        ("A page of real text.", False, False),
        ("words from the scan", False, True),
        ("", False, False),
    ]
    without_ocr = extract(buffer.getvalue())
    assert [page.needs_ocr for page in without_ocr.pages] == [False, True, False]


def test_failed_ocr_leaves_the_page_needing_ocr(scanned_pdf):
    document = extract(scanned_pdf, ocr=FakeOcrEngine(fail=True))
    assert document.pages == [ExtractedPage(text="", needs_ocr=True, ocr=False)]


def test_ocr_that_finds_nothing_means_no_text(scanned_pdf):
    with pytest.raises(ExtractionError, match="not even by OCR"):
        extract(scanned_pdf, ocr=FakeOcrEngine(""))


# --- text and Markdown ---------------------------------------------------------------------------


def test_plain_utf8_text():
    document = extract("Grüße aus München.\nZweite Zeile.".encode(), filename="notes.txt")
    assert document.kind == "text"
    assert _texts(document) == ["Grüße aus München.\nZweite Zeile."]
    assert document.title is None


def test_markdown_is_told_by_its_name_and_takes_its_title_from_the_first_heading():
    data = b"# Release notes\n\nSome *emphasis* here.\n"
    for name in ("notes.md", "NOTES.markdown"):
        document = extract(data, filename=name)
        assert document.kind == "markdown"
        assert document.title == "Release notes"
        assert "Some *emphasis* here." in document.pages[0].text
    assert extract(data, filename="upload", content_type="text/markdown; charset=utf-8").kind == "markdown"
    assert extract(data, filename="notes.txt").kind == "text"


def test_utf8_with_bom():
    document = extract(b"\xef\xbb\xbfcaf\xc3\xa9 cr\xc3\xa8me", filename="a.txt")
    assert _texts(document) == ["café crème"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_with_bom(encoding):
    text = "Ünïcödé text — with a dash and ☃"
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    assert _texts(extract(data, filename="a.txt")) == [text]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"caf\xe9", "café"),
        (b"caf\xe9 au lait, cr\xe8me br\xfbl\xe9e", "café au lait, crème brûlée"),
        ("Grüße aus München, schön".encode("cp1252"), "Grüße aus München, schön"),
        ("Smart \u201cquotes\u201d cost \u20ac5".encode("cp1252"), "Smart \u201cquotes\u201d cost \u20ac5"),
    ],
)
def test_windows_1252_text(raw, expected):
    assert _texts(extract(raw, filename="legacy.txt")) == [expected]


def test_other_legacy_encoding_is_guessed():
    text = "Привет, мир! Это обычный текстовый файл в старой кодировке Windows."
    assert _texts(extract(text.encode("cp1251"), filename="ru.txt")) == [text]


def test_line_ends_are_normalised_and_control_characters_removed():
    document = extract(b"one\r\ntwo\rthree\x00\x07\x1b four\tfive", filename="a.txt")
    assert _texts(document) == ["one\ntwo\nthree four\tfive"]


def test_form_feeds_are_page_breaks():
    document = extract(b"page one\fpage two\f\fpage four\f", filename="printout.txt")
    assert _texts(document) == ["page one", "page two", "", "page four"]


def test_form_feed_pages_count_against_max_pages():
    with pytest.raises(ExtractionError, match="limit is 3"):
        extract(b"a\fb\fc\fd", filename="a.txt", limits=ExtractionLimits(max_pages=3))


def test_long_text_is_cut_into_pages_at_paragraph_breaks():
    paragraphs = [f"Paragraph {i}. " + "word " * 60 for i in range(100)]
    text = "\n\n".join(paragraphs)
    texts = _texts(extract(text.encode(), filename="long.txt"))
    assert len(texts) > 5
    assert all(len(page) <= TEXT_PAGE_CHARS for page in texts)
    # Every page is whole paragraphs: it starts with "Paragraph" and no paragraph is split.
    for page in texts:
        assert page.startswith("Paragraph ")
        for paragraph in page.split("\n\n"):
            assert paragraph.strip() in {p.strip() for p in paragraphs}
    assert "\n\n".join(texts).split() == text.split()


def test_one_endless_line_is_still_cut():
    text = "x" * (TEXT_PAGE_CHARS * 2 + 10)
    texts = _texts(extract(text.encode(), filename="a.txt"))
    assert [len(page) for page in texts] == [TEXT_PAGE_CHARS, TEXT_PAGE_CHARS, 10]


def test_whitespace_only_text_has_no_text():
    with pytest.raises(ExtractionError, match="No text"):
        extract(b" \n\t\r\n  \n", filename="blank.txt")


def test_text_over_max_chars_is_refused():
    with pytest.raises(ExtractionError, match="characters"):
        extract(b"word " * 1000, filename="a.txt", limits=ExtractionLimits(max_chars=1000))


def test_binary_junk_is_not_a_supported_format():
    junk = random.Random(7).randbytes(4096)
    with pytest.raises(ExtractionError, match=SUPPORTED.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        extract(junk, filename="mystery.bin")
    with pytest.raises(ExtractionError, match="not a supported format"):
        extract(b"\x00" * 100, filename="zeros")


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "PNG image"),
        (b"\xff\xd8\xff\xe0" + bytes(200), "JPEG image"),
        (b"{\\rtf1\\ansi Hello}", "Rich Text"),
    ],
)
def test_known_binary_formats_are_named(data, hint):
    with pytest.raises(ExtractionError, match="not a supported format") as excinfo:
        extract(data, filename="upload")
    assert hint in str(excinfo.value)


def test_old_office_files():
    ole2 = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600)
    with pytest.raises(ExtractionError, match=r"Old Word \.doc"):
        extract(ole2, filename="letter.doc")
    # Word saves a password-protected .docx as such a file, not as a ZIP.
    with pytest.raises(ExtractionError, match="protected by a password"):
        extract(ole2, filename="letter.docx")
    with pytest.raises(ExtractionError, match="not a supported format"):
        extract(ole2, filename="sheet.xls")


# --- Word .docx ----------------------------------------------------------------------------------


def test_docx_paragraphs_tabs_breaks_and_title():
    data = make_docx(["Services Agreement", "Name:\tNorthwind Ltd", "Line one\nLine two"], title="The Agreement")
    document = extract(data, filename="agreement.docx")
    assert document.kind == "docx"
    assert document.title == "The Agreement"
    assert _texts(document) == ["Services Agreement\nName:\tNorthwind Ltd\nLine one\nLine two"]


def test_docx_is_told_by_content_not_name():
    data = make_docx(["Hello from Word"])
    assert extract(data, filename="upload.bin").kind == "docx"
    assert extract(data).pages[0].text == "Hello from Word"


def test_docx_without_core_properties_has_no_title():
    assert extract(make_docx(["Text"]), filename="a.docx").title is None


def test_docx_tables_row_by_row():
    body = docx_paragraph("Fees:") + docx_table([["Item", "Price"], ["Support", "4,800"], ["", ""]])
    document = extract(make_docx(body), filename="fees.docx")
    assert _texts(document) == ["Fees:\nItem | Price\nSupport | 4,800"]


def test_docx_explicit_page_breaks_make_pages():
    body = (
        docx_paragraph("Page one text")
        + docx_paragraph("Page two text", page_break_before=True)
        + "<w:p><w:r><w:lastRenderedPageBreak/><w:t>Page three text</w:t></w:r></w:p>"
    )
    assert _texts(extract(make_docx(body), filename="a.docx")) == ["Page one text", "Page two text", "Page three text"]


def test_docx_without_page_breaks_is_cut_like_text():
    paragraphs = [f"Paragraph {i}. " + "word " * 80 for i in range(60)]
    texts = _texts(extract(make_docx(paragraphs), filename="long.docx"))
    assert len(texts) > 5
    assert all(len(page) <= TEXT_PAGE_CHARS for page in texts)
    assert all(page.startswith("Paragraph ") for page in texts)
    assert " ".join(texts).split() == " ".join(paragraphs).split()


def test_docx_reads_only_visible_text():
    """Deleted text (tracked changes), field codes, tab stop definitions and the fallback copy of a
    text box are not text of the document."""
    mc = "http://schemas.openxmlformats.org/markup-compatibility/2006"
    body = (
        '<w:p><w:pPr><w:tabs><w:tab w:val="left" w:pos="720"/></w:tabs></w:pPr>'
        "<w:r><w:t>Kept</w:t></w:r>"
        "<w:del><w:r><w:delText>DELETED</w:delText></w:r></w:del>"
        "<w:r><w:instrText>PAGE \\* MERGEFORMAT</w:instrText></w:r>"
        f'<mc:AlternateContent xmlns:mc="{mc}"><mc:Choice Requires="wps"><w:r><w:t> box</w:t></w:r></mc:Choice>'
        "<mc:Fallback><w:r><w:t>FALLBACK</w:t></w:r></mc:Fallback></mc:AlternateContent>"
        "</w:p>"
    )
    assert _texts(extract(make_docx(body), filename="a.docx")) == ["Kept box"]


def test_docx_zip_bomb_is_refused_before_reading():
    """A 1 MB .docx holding a 256 MB file of zeros (over the 200 MB default)."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(make_docx(["Innocent"]))) as source,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive,
    ):
        for info in source.infolist():
            archive.writestr(info.filename, source.read(info))
        with archive.open("word/media/image1.bin", "w", force_zip64=True) as member:
            for _ in range(16):
                member.write(bytes(16 * 1024 * 1024))
    data = buffer.getvalue()
    assert len(data) < 2 * 1024 * 1024
    with pytest.raises(ExtractionError, match="more than 200 MB when unpacked"):
        extract(data, filename="bomb.docx")


def test_docx_document_xml_over_the_limit_is_refused():
    data = make_docx(["word " * 50_000])
    with pytest.raises(ExtractionError, match="more than 0 MB when unpacked"):
        extract(data, filename="a.docx", limits=ExtractionLimits(max_uncompressed_bytes=100_000))


def _patch_zip_headers(data: bytes, name: bytes, *, local: tuple[int, bytes], central: tuple[int, bytes]) -> bytes:
    """The archive with bytes of one member's local header and central directory entry replaced:
    ``local``/``central`` are (offset in that header, new bytes)."""
    out = bytearray(data)
    headers = (
        (b"PK\x03\x04", 26, 30, local),  # signature, offset of the name's length, of the name
        (b"PK\x01\x02", 28, 46, central),
    )
    for signature, length_offset, name_offset, (offset, value) in headers:
        position = out.find(signature)
        while position != -1:
            name_length = int.from_bytes(out[position + length_offset : position + length_offset + 2], "little")
            if bytes(out[position + name_offset : position + name_offset + name_length]) == name:
                out[position + offset : position + offset + len(value)] = value
            position = out.find(signature, position + 4)
    return bytes(out)


def _lie_about_size(data: bytes, name: bytes, size: int) -> bytes:
    """The archive with the member's uncompressed size in both its headers replaced by ``size``."""
    value = size.to_bytes(4, "little")
    return _patch_zip_headers(data, name, local=(22, value), central=(24, value))


def test_docx_member_larger_than_its_header_says_is_not_read_past_the_header():
    data = _lie_about_size(make_docx(["word " * 400_000]), b"word/document.xml", 1000)
    with pytest.raises(ExtractionError, match="damaged"):
        extract(data, filename="liar.docx", limits=ExtractionLimits(max_uncompressed_bytes=100_000))


@pytest.mark.parametrize(
    "prolog",
    [
        # Billion laughs: a few hundred bytes that expand to gigabytes.
        '<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
        '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">'
        '<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>\n',
        # An external entity that would read a local file.
        '<!DOCTYPE w:document [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n',
        # A DOCTYPE alone: Word never writes one.
        "<!DOCTYPE w:document>\n",
    ],
)
def test_docx_with_a_doctype_is_refused(prolog):
    entity = "&lol4;" if "lol" in prolog else "&xxe;" if "xxe" in prolog else ""
    xml = docx_document_xml(f"<w:p><w:r><w:t>Hello {entity}</w:t></w:r></w:p>", prolog=prolog)
    with pytest.raises(ExtractionError, match="DOCTYPE") as excinfo:
        extract(make_docx("", document_xml=xml), filename="evil.docx")
    assert "root:" not in str(excinfo.value)


def test_docx_with_an_encrypted_member_is_refused():
    data = make_docx(["Secret"])
    # General purpose flag bit 0: "encrypted" (the traditional PKWARE cipher); zipfile cannot write one.
    flags = (1).to_bytes(2, "little")
    data = _patch_zip_headers(data, b"word/document.xml", local=(6, flags), central=(8, flags))
    with pytest.raises(ExtractionError, match="protected by a password"):
        extract(data, filename="secret.docx")


def test_truncated_docx_is_damaged():
    data = make_docx(["Some text " * 100])
    with pytest.raises(ExtractionError, match="damaged"):
        extract(data[: len(data) // 2], filename="cut.docx")
    with pytest.raises(ExtractionError, match="damaged"):
        extract(data[: len(data) // 2], filename="cut.zip")


def test_corrupt_document_xml_is_damaged():
    with pytest.raises(ExtractionError, match="damaged"):
        extract(make_docx("", document_xml=b"<w:document><w:body><w:p>"), filename="a.docx")


def test_zip_that_is_not_a_word_document():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(ExtractionError, match="not a supported format"):
        extract(buffer.getvalue(), filename="book.xlsx")
    with pytest.raises(ExtractionError, match="not a Word .docx document"):
        extract(buffer.getvalue(), filename="renamed.docx")


def test_text_named_docx_is_not_a_word_document():
    with pytest.raises(ExtractionError, match="not a Word .docx document"):
        extract(b"plain text with the wrong name", filename="report.docx")


def test_docx_without_text_is_refused():
    with pytest.raises(ExtractionError, match="No text could be found in this Word document"):
        extract(make_docx(["", "   "]), filename="pictures.docx")


# --- e-mail --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def email_with_pdf() -> tuple[bytes, bytes]:
    attachment = make_pdf(CONTRACT_PAGES, title="Services Agreement")
    data = make_eml(
        subject="Signed contract attached",
        cc="Carol <carol@example.com>",
        plain="Hi Bob,\n\nplease find the signed contract attached.\n\nAlice",
        attachments=[("contract.pdf", attachment, "application/pdf")],
    )
    return data, attachment


def test_email_with_plain_body_and_a_pdf_attachment(email_with_pdf):
    data, attachment = email_with_pdf
    document = extract(data, filename="message.eml")
    assert document.kind == "email"
    assert document.title == "Signed contract attached"
    first = document.pages[0].text
    assert first.startswith("From: Alice Example <alice@example.com>\nTo: Bob Example <bob@example.com>\n")
    assert "Cc: Carol <carol@example.com>" in first
    assert "Date: Mon, 02 Mar 2026 09:30:00 +0000" in first
    assert "Subject: Signed contract attached" in first
    assert "Attachments: contract.pdf" in first
    assert "please find the signed contract attached." in first
    assert "JVBERi0" not in first  # the attachment's base64 is not body text
    assert document.attachments == [
        Attachment(filename="contract.pdf", data=attachment, content_type="application/pdf")
    ]
    # The attachment is a document of its own, read later.
    assert "Northwind" in extract(document.attachments[0].data, filename="contract.pdf").pages[0].text


def test_email_is_told_by_its_headers_without_a_name(email_with_pdf):
    assert extract(email_with_pdf[0], filename="upload").kind == "email"
    assert extract(email_with_pdf[0], filename="upload.txt").kind == "email"


def test_email_with_only_an_html_body():
    html = (
        "<html><head><title>ignored</title><style>p { color: red }</style></head><body>"
        "<p>Dear Bob,</p><p>the fee is <b>4,800&nbsp;pounds</b> &amp; payable monthly.</p>"
        "<script>alert('no')</script><ul><li>first</li><li>second</li></ul></body></html>"
    )
    document = extract(make_eml(html=html), filename="html.eml")
    body = document.pages[0].text.split("\n\n", 1)[1]
    assert body == "Dear Bob,\nthe fee is 4,800 pounds & payable monthly.\nfirst\nsecond"
    assert document.attachments == []


def test_email_prefers_the_plain_part_of_an_alternative():
    data = make_eml(plain="The plain words.", html="<p>The <i>HTML</i> words.</p>")
    text = extract(data, filename="a.eml").pages[0].text
    assert "The plain words." in text
    assert "HTML" not in text


def test_email_with_empty_body_but_attachments_is_fine():
    data = make_eml(plain="", attachments=[("notes.txt", b"attached notes", "text/plain")])
    document = extract(data, filename="a.eml")
    assert document.title == "Contract renewal"
    assert document.attachments == [Attachment(filename="notes.txt", data=b"attached notes", content_type="text/plain")]


def test_email_attachments_over_the_limit_are_ignored_not_fatal():
    attachments = [(f"file{i}.txt", f"content {i}".encode(), "text/plain") for i in range(5)]
    document = extract(
        make_eml(plain="five files", attachments=attachments), limits=ExtractionLimits(max_attachments=3)
    )
    assert [attachment.filename for attachment in document.attachments] == ["file0.txt", "file1.txt", "file2.txt"]


def test_email_attachment_names_lose_their_directories():
    data = make_eml(plain="x", attachments=[("../../etc/passwd", b"root:x:0:0", "text/plain")])
    assert extract(data).attachments[0].filename == "passwd"


def test_email_long_body_is_cut_into_pages_after_the_headers():
    body = "\n\n".join(f"Point {i}. " + "detail " * 50 for i in range(60))
    document = extract(make_eml(plain=body), filename="long.eml")
    assert len(document.pages) > 3
    assert document.pages[0].text.startswith("From: ")
    assert all(len(page.text) <= TEXT_PAGE_CHARS for page in document.pages)
    assert "Point 59." in document.pages[-1].text


def test_email_encoded_subject_is_decoded():
    data = b"From: a@example.com\r\nTo: b@example.com\r\nSubject: =?utf-8?q?Caf=C3=A9_invoice?=\r\n\r\nBody.\r\n"
    document = extract(data, filename="a.eml")
    assert document.title == "Café invoice"
    assert "Body." in document.pages[0].text


def test_email_raw_8bit_headers_are_decoded():
    data = (
        b"From: Ren\xc3\xa9 <rene@example.com>\r\nTo: b@example.com\r\nSubject: caf\xe9 menu\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n\r\nBody.\r\n"
    )
    document = extract(data, filename="a.eml")
    assert document.title == "café menu"  # not UTF-8: Windows-1252
    assert "From: René <rene@example.com>" in document.pages[0].text


def test_no_break_and_other_unicode_spaces_are_stored_as_spaces_one_for_one():
    from documents.extraction import clean_text

    assert clean_text("Fee\u00a0is \u00a34\u202f500\u2009a\u3000month\u2028next\u2029line") == (
        "Fee is \u00a34 500 a month\nnext\nline"
    )
    text = "Licensee\u00a0shall\u00a0pay\u00a0Fox"
    assert len(clean_text(text)) == len(text)


def test_a_real_edgar_pdf_with_a_no_break_space_between_its_words_is_read_with_spaces():
    from pathlib import Path

    from django.conf import settings as django_settings

    # CUAD-dev's dev-00.pdf (an EDGAR filing printed from HTML): U+00A0 between most of its words.
    path = Path(django_settings.BASE_DIR).parent / "shared" / "data" / "cuad-dev" / "pdf" / "dev-00.pdf"
    data = path.read_bytes()
    raw = "".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages)
    assert raw.count("\u00a0") > 1000  # what pypdf gives
    document = extract(data, filename=path.name)
    text = "".join(page.text for page in document.pages)
    assert "\u00a0" not in text and "Fox shall" in text


def test_lone_surrogates_never_reach_the_text():
    from documents.extraction import clean_text

    assert clean_text("a\ud800b\udfffc") == "abc"


def test_forwarded_email_is_an_attachment():
    inner = make_eml(subject="Original message", plain="The original words.")
    from email import message_from_bytes, policy

    outer = message_from_bytes(make_eml(subject="Fwd: Original message", plain="See below."), policy=policy.default)
    outer.add_attachment(message_from_bytes(inner, policy=policy.default))
    document = extract(outer.as_bytes(), filename="fwd.eml")
    assert "See below." in document.pages[0].text
    assert "The original words." not in document.pages[0].text
    [attachment] = document.attachments
    assert attachment.content_type == "message/rfc822"
    assert attachment.filename == "Original message.eml"
    forwarded = extract(attachment.data, filename=attachment.filename)
    assert forwarded.title == "Original message"
    assert "The original words." in forwarded.pages[0].text


def test_one_header_is_an_email_only_when_named_eml():
    data = b"Subject: meeting notes\n\nWe agreed on the plan.\n"
    assert extract(data, filename="notes.txt").kind == "text"
    assert extract(data, filename="notes.eml").kind == "email"
    assert extract(b"From: Alice\nTo: Bob\n\nHello", filename="note").kind == "email"
    assert extract(b"Dear Bob,\nFrom: the text\nTo: nobody\n", filename="x.eml").kind == "text"


# --- page offsets --------------------------------------------------------------------------------


def test_page_offsets_point_at_each_page_in_the_joined_text():
    pages = ["first page", "", "third\npage", "x"]
    joined = "\n\n".join(pages)
    offsets = page_offsets(pages)
    assert offsets == [0, 12, 14, 26]
    for offset, page in zip(offsets, pages, strict=True):
        assert joined[offset : offset + len(page)] == page


def test_page_offsets_other_separator_and_empty():
    assert page_offsets(["ab", "cd", "ef"], separator="\f") == [0, 3, 6]
    assert page_offsets([]) == []


def test_page_offsets_of_an_extracted_document(contract_pdf):
    texts = _texts(extract(contract_pdf))
    joined = "\n\n".join(texts)
    for offset, text in zip(page_offsets(texts), texts, strict=True):
        assert joined[offset : offset + len(text)] == text
    assert joined.index("4,800 pounds") >= page_offsets(texts)[1]


# --- nothing but ExtractionError -----------------------------------------------------------------


def _check_outcome(data: bytes, filename: str) -> str:
    try:
        result = extract(data, filename=filename)
    except ExtractionError as exc:
        assert str(exc), "an ExtractionError needs a message"
        return "error"
    assert isinstance(result, ExtractedDocument)
    assert result.kind in KINDS
    assert all(isinstance(page, ExtractedPage) for page in result.pages)
    assert all("\x00" not in page.text for page in result.pages)
    assert result.has_text or any(page.needs_ocr for page in result.pages), "a document without text must be an error"
    return "document"


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
            outcomes[_check_outcome(data, "mutated.pdf")] += 1
        except AssertionError:
            raise
        except Exception as exc:  # anything else escaping is the failure this test looks for
            pytest.fail(f"seed {seed}: {type(exc).__name__} escaped extract: {exc!r}")
    # The mutations really exercise both outcomes (otherwise the loop proves little).
    assert outcomes["document"] > 0
    assert outcomes["error"] > 0


FUZZ_SETTINGS = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
FILENAMES = st.sampled_from(["", "upload.pdf", "upload.docx", "upload.eml", "upload.md", "upload.txt", "upload.doc"])


@FUZZ_SETTINGS
@given(data=st.binary(max_size=4096), filename=FILENAMES)
def test_fuzz_any_bytes(data, filename):
    event(_check_outcome(data, filename))


@st.composite
def _mutated(draw, good: bytes) -> bytes:
    data = bytearray(good)
    for _ in range(draw(st.integers(0, 12))):
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(data) - 1))
        del data[start : start + draw(st.integers(1, 400))]
    if draw(st.booleans()):
        data = data[: draw(st.integers(1, len(data)))]
    return bytes(data)


_GOOD_PDF = make_pdf(CONTRACT_PAGES, title="Services Agreement")
_GOOD_DOCX = make_docx(
    docx_paragraph("Services Agreement")
    + docx_table([["Fee", "4,800"], ["Term", "24 months"]])
    + docx_paragraph("Page two", page_break_before=True),
    title="Agreement",
)
# Stored, not deflated: mutations then hit the XML and not only the compressed bytes.
_GOOD_DOCX_STORED = io.BytesIO()
with zipfile.ZipFile(io.BytesIO(_GOOD_DOCX)) as _source, zipfile.ZipFile(_GOOD_DOCX_STORED, "w") as _target:
    for _info in _source.infolist():
        _target.writestr(_info.filename, _source.read(_info))
_GOOD_EML = make_eml(
    plain="Body text.", html="<p>Body <b>text</b>.</p>", attachments=[("a.txt", b"attached", "text/plain")]
)


@FUZZ_SETTINGS
@given(data=_mutated(_GOOD_PDF), filename=FILENAMES)
def test_fuzz_mutated_pdf(data, filename):
    event(_check_outcome(data, filename))


@FUZZ_SETTINGS
@given(data=st.one_of(_mutated(_GOOD_DOCX), _mutated(_GOOD_DOCX_STORED.getvalue())), filename=FILENAMES)
def test_fuzz_mutated_docx(data, filename):
    event(_check_outcome(data, filename))


@FUZZ_SETTINGS
@given(data=_mutated(_GOOD_EML), filename=FILENAMES)
def test_fuzz_mutated_email(data, filename):
    event(_check_outcome(data, filename))
