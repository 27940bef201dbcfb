"""OCR of scanned PDF pages with Debian's poppler-utils (pdftoppm) and tesseract.

The only extraction code that runs external programs. A page is rendered to a PNG at 300 dpi in a
temporary directory and read by tesseract; the PDF itself goes to pdftoppm on stdin, so it is
never written to disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PDFTOPPM = "pdftoppm"
TESSERACT = "tesseract"
DPI = 300


class OcrError(Exception):
    """OCR of one page failed (a program missing, crashed or too slow). The page is then kept as
    needing OCR rather than failing the whole document."""


class OcrEngine:
    def __init__(self, *, language: str = "eng", dpi: int = DPI):
        self.language = language
        self.dpi = dpi

    @staticmethod
    def available() -> bool:
        return shutil.which(PDFTOPPM) is not None and shutil.which(TESSERACT) is not None

    def ocr_pdf_page(self, pdf_data: bytes, page_index: int, *, timeout_s: float = 120) -> str:
        """The text tesseract reads on page ``page_index`` (0-based) of the PDF."""
        deadline = time.monotonic() + timeout_s
        page_number = str(page_index + 1)
        with tempfile.TemporaryDirectory(prefix="ocr-") as directory:
            image_root = Path(directory) / "page"
            self._run(
                [PDFTOPPM, "-r", str(self.dpi), "-f", page_number, "-l", page_number, "-png", "-singlefile"]
                + ["-", str(image_root)],
                stdin_data=pdf_data,
                deadline=deadline,
            )
            image = image_root.with_suffix(".png")
            if not image.exists():
                raise OcrError(f"pdftoppm rendered no image of page {page_number}")
            output = self._run([TESSERACT, str(image), "stdout", "-l", self.language], deadline=deadline)
        return output.decode("utf-8", errors="replace")

    @staticmethod
    def _run(command: list[str], *, deadline: float, stdin_data: bytes | None = None) -> bytes:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise OcrError(f"no time left for {command[0]}")
        # One thread: pages are read one after another, and OpenMP threads multiply the memory a
        # sandboxed process needs without making one page much faster.
        env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        try:
            result = subprocess.run(
                command,
                input=stdin_data,
                stdin=None if stdin_data is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=remaining_s,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise OcrError(f"{command[0]} took longer than {remaining_s:.3g} s") from exc
        except OSError as exc:
            raise OcrError(f"{command[0]} could not be started: {exc}") from exc
        if result.returncode != 0:
            detail = result.stderr.decode("utf-8", errors="replace").strip()[-500:]
            raise OcrError(f"{command[0]} exited with {result.returncode}: {detail}")
        return result.stdout


def default_ocr_engine() -> OcrEngine | None:
    """An engine when pdftoppm and tesseract are installed, else None (pages are then kept as
    needing OCR)."""
    return OcrEngine() if OcrEngine.available() else None
