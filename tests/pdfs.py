"""Real PDF files made for tests, with pypdf (no binary fixtures in the repository)."""

from __future__ import annotations

import io

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
