"""Real files made for tests: PDFs with pypdf (and scanned pages with Pillow), Word .docx files with
zipfile, e-mails with the stdlib. No binary fixtures in the repository."""

from __future__ import annotations

import email.policy
import io
import zipfile
import zlib
from email.message import EmailMessage
from xml.sax.saxutils import escape as xml_escape

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[str], *, title: str | None = None, password: str | None = None) -> bytes:
    """A PDF whose page i shows the lines of pages[i] in Helvetica (empty string: a blank page)."""
    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        font = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
        )
        ops = ["BT", "/F1 11 Tf", "14 TL", "72 740 Td"]
        for line in text.splitlines():
            ops.append(f"({_escape(line)}) Tj T*")
        ops.append("ET")
        stream = DecodedStreamObject()
        stream.set_data("\n".join(ops).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(stream)
    if title:
        writer.add_metadata({"/Title": title})
    if password:
        writer.encrypt(user_password=password, owner_password=password + "-owner")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


CONTRACT_PAGES = [
    "SERVICES AGREEMENT\nThis agreement is made between Northwind Ltd (the Supplier)\nand Contoso plc (the Customer) on 1 March 2026.\n"
    "1. Services. The Supplier will maintain the Customer's payroll software.\n2. Term. The agreement runs for 24 months.",
    "3. Fees. The Customer pays 4,800 pounds per month, invoiced monthly.\n"
    "4. Payment terms. Invoices are due within 30 days of receipt.\n"
    "5. Termination. Either party may end the agreement with 90 days written notice.",
    "6. Confidentiality. Each party keeps the other's information confidential\nfor five years after the agreement ends.\n"
    "7. Liability. Total liability is capped at the fees paid in the previous 12 months.",
]


# --- more formats, made the same way (no binary fixtures) ---------------------------------------

FONT_PATH = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"  # Debian's fonts-dejavu-core


def make_scanned_pdf(lines: list[str], *more_pages: list[str], font_size: int = 40) -> bytes:
    """A PDF whose pages are only pictures of text (black on white, like a scan), no text layer.

    Page 1 shows ``lines``, page 2 ``more_pages[0]`` and so on."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(FONT_PATH, font_size)
    images = []
    for page_lines in (lines, *more_pages):
        image = Image.new("L", (1700, 2200), color=255)  # US Letter at 200 dpi
        draw = ImageDraw.Draw(image)
        y = 150
        for line in page_lines:
            draw.text((150, y), line, fill=0, font=font)
            y += int(font_size * 1.6)
        images.append(image)
    buffer = io.BytesIO()
    images[0].save(buffer, "PDF", resolution=200, save_all=True, append_images=images[1:])
    return buffer.getvalue()


def hand_made_pdf(objects: list[bytes], *, root: int = 1) -> bytes:
    """A PDF of the given object bodies (object n is objects[n - 1]) with a correct xref table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, root, xref)
    return bytes(out)


def zlib_bomb(uncompressed_bytes: int, *, block_bytes: int = 16 * 1024 * 1024) -> bytes:
    """A valid zlib stream of ``uncompressed_bytes`` zero bytes, about a thousandth of that in size.

    Made without holding the inflated data: one fully flushed deflate block of zeros, repeated
    (a full flush leaves no references back, so the copies are independent), then the final block
    and the Adler-32 of all those zeros (a = 1, b = n mod 65521)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(block_bytes)) + compressor.flush(zlib.Z_FULL_FLUSH)
    final = compressor.flush(zlib.Z_FINISH)
    count = max(1, uncompressed_bytes // block_bytes)
    adler = ((count * block_bytes) % 65521) << 16 | 1
    return b"\x78\xda" + block * count + final + adler.to_bytes(4, "big")


W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def docx_paragraph(text: str, *, page_break_before: bool = False) -> str:
    """One w:p; "\\t" in ``text`` becomes w:tab and "\\n" becomes w:br."""
    runs = []
    if page_break_before:
        runs.append('<w:r><w:br w:type="page"/></w:r>')
    for i, line in enumerate(text.split("\n")):
        if i:
            runs.append("<w:r><w:br/></w:r>")
        for j, piece in enumerate(line.split("\t")):
            if j:
                runs.append("<w:r><w:tab/></w:r>")
            if piece:
                runs.append(f'<w:r><w:t xml:space="preserve">{xml_escape(piece)}</w:t></w:r>')
    return "<w:p>" + "".join(runs) + "</w:p>"


def docx_table(rows: list[list[str]]) -> str:
    cells = "".join(
        "<w:tr>" + "".join(f"<w:tc>{docx_paragraph(cell)}</w:tc>" for cell in row) + "</w:tr>" for row in rows
    )
    return f"<w:tbl>{cells}</w:tbl>"


def docx_document_xml(body: str, *, prolog: str = "") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n{prolog}'
        f'<w:document xmlns:w="{W_NS}"><w:body>{body}</w:body></w:document>'
    ).encode()


def make_docx(
    body: str | list[str],
    *,
    title: str | None = None,
    document_xml: bytes | None = None,
    extra_members: dict[str, bytes] | None = None,
) -> bytes:
    """A minimal .docx. ``body``: the inner XML of w:body, or a list of paragraph texts."""
    if isinstance(body, list):
        body = "".join(docx_paragraph(text) for text in body)
    members = {
        "[Content_Types].xml": (
            b'<?xml version="1.0" encoding="UTF-8"?>'
            b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            b'<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            b'<Default Extension="xml" ContentType="application/xml"/>'
            b'<Override PartName="/word/document.xml" '
            b'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
            b"</Types>"
        ),
        "_rels/.rels": (
            b'<?xml version="1.0" encoding="UTF-8"?>'
            b'<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            b'<Relationship Id="rId1" Target="word/document.xml" '
            b'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument"/>'
            b"</Relationships>"
        ),
        "word/document.xml": document_xml if document_xml is not None else docx_document_xml(body),
    }
    if title is not None:
        members["docProps/core.xml"] = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" '
            f'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{xml_escape(title)}</dc:title></cp:coreProperties>'
        ).encode()
    members.update(extra_members or {})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def make_eml(
    *,
    subject: str = "Contract renewal",
    sender: str = "Alice Example <alice@example.com>",
    to: str = "Bob Example <bob@example.com>",
    cc: str | None = None,
    plain: str | None = None,
    html: str | None = None,
    attachments: list[tuple[str, bytes, str]] | None = None,
) -> bytes:
    """An RFC 5322 message as an e-mail client saves it (.eml). attachments: (filename, data, type)."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    if cc:
        message["Cc"] = cc
    message["Subject"] = subject
    message["Date"] = "Mon, 02 Mar 2026 09:30:00 +0000"
    message["Message-ID"] = "<test-1@example.com>"
    if plain is not None:
        message.set_content(plain)
        if html is not None:
            message.add_alternative(html, subtype="html")
    elif html is not None:
        message.set_content(html, subtype="html")
    for filename, data, content_type in attachments or []:
        maintype, subtype = content_type.split("/", 1)
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
    return message.as_bytes(policy=email.policy.SMTP)
