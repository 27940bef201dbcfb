"""``scripts/system-packages``: what ``make test`` (and so ``.ci/run``) needs from Debian."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system-packages"


def run_check(path: str) -> subprocess.CompletedProcess:
    bash = shutil.which("bash")
    return subprocess.run(
        [bash, str(SCRIPT), "--check"], env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=30
    )


def test_a_machine_without_the_programs_is_told_in_one_line_what_to_install(tmp_path):
    # A PATH holding only `id`: none of chromium, tesseract or pdftoppm can be found.
    (tmp_path / "id").symlink_to(shutil.which("id"))
    result = run_check(str(tmp_path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "chromium tesseract-ocr tesseract-ocr-eng poppler-utils" in lines[0]
    assert "apt-get install -y chromium" in lines[0]


def test_this_machine_has_what_the_tests_need():
    # The suite's browser and OCR tests ran here only because this holds; `make test` ran the
    # script before pytest.
    result = run_check(os.environ["PATH"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_make_test_and_ci_run_go_through_it():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "test: system-packages install" in makefile
    assert "\tscripts/system-packages\n" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
