"""documents/sandbox.py: extraction in a child process, stopped by a time and a memory limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from documents import sandbox as sandbox_module
from documents.extraction import ExtractionError, ExtractionLimits, extract
from documents.ocr import OcrEngine
from documents.sandbox import SandboxLimits, _sandbox_pid, extract_in_sandbox
from tests.pdfs import CONTRACT_PAGES, hand_made_pdf, make_eml, make_pdf, make_scanned_pdf, zlib_bomb

BASE_DIR = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def contract_pdf() -> bytes:
    return make_pdf(CONTRACT_PAGES, title="Services Agreement")


@pytest.fixture(scope="module")
def bomb_pdf() -> bytes:
    """One page whose content stream is 4 MB of zlib that inflates to 4 GB."""
    stream = zlib_bomb(4 * 1024**3)
    return hand_made_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << >> /Contents 4 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        ]
    )


def test_a_pdf_round_trips_through_the_sandbox(contract_pdf):
    in_sandbox = extract_in_sandbox(contract_pdf, filename="contract.pdf")
    assert in_sandbox == extract(contract_pdf, filename="contract.pdf")
    assert in_sandbox.title == "Services Agreement"
    assert "Northwind" in in_sandbox.pages[0].text


def test_an_email_with_its_attachment_round_trips(contract_pdf):
    data = make_eml(plain="See attached.", attachments=[("contract.pdf", contract_pdf, "application/pdf")])
    document = extract_in_sandbox(data, filename="mail.eml", limits=ExtractionLimits(max_attachments=5))
    assert document == extract(data, filename="mail.eml")
    assert document.kind == "email"
    assert document.attachments[0].data == contract_pdf


def test_the_limits_are_applied_in_the_child(contract_pdf):
    with pytest.raises(ExtractionError, match="limit is 2"):
        extract_in_sandbox(contract_pdf, limits=ExtractionLimits(max_pages=2))


@pytest.mark.parametrize(
    ("data", "filename"),
    [
        (b"plain text, but named as a PDF", "report.pdf"),
        (make_pdf(["secret"], password="hunter2"), "locked.pdf"),
        (b"\x89PNG\r\n\x1a\n" + bytes(100), "photo.png"),
        (b"", "empty.txt"),
    ],
)
def test_an_extraction_error_crosses_the_process_boundary_intact(data, filename):
    with pytest.raises(ExtractionError) as direct:
        extract(data, filename=filename)
    with pytest.raises(ExtractionError) as sandboxed:
        extract_in_sandbox(data, filename=filename)
    assert str(sandboxed.value) == str(direct.value)


def test_a_file_taking_too_long_is_stopped(contract_pdf):
    sandbox_module._shutdown()  # a warm child reads this file in a few ms; a cold one cannot start in 10
    started = time.monotonic()
    with pytest.raises(ExtractionError) as excinfo:
        extract_in_sandbox(contract_pdf, sandbox=SandboxLimits(timeout_s=0.01))
    assert str(excinfo.value) == "Reading this file took longer than 0.01 s; it may be damaged or far too large."
    assert time.monotonic() - started < 10


def test_a_file_needing_too_much_memory_is_stopped(bomb_pdf):
    """pypdf inflates the bomb up to its 75 MB limit, more than a 128 MB child can hold."""
    with pytest.raises(ExtractionError) as excinfo:
        extract_in_sandbox(bomb_pdf, sandbox=SandboxLimits(memory_bytes=128 * 1024 * 1024))
    assert str(excinfo.value).startswith("Reading this file needed more than 128 MB of memory")


def test_a_tiny_memory_limit_still_ends_in_a_clean_extraction_error(contract_pdf):
    """Under 16 MB even importing the parser fails; the person still gets a sentence, not a trace."""
    with pytest.raises(ExtractionError, match="needed more than 16 MB of memory"):
        extract_in_sandbox(contract_pdf, sandbox=SandboxLimits(memory_bytes=16 * 1024 * 1024))


def test_a_decompression_bomb_stays_within_ordinary_memory(bomb_pdf):
    """With 512 MB the bomb is refused by the parser's own limit: memory stays bounded, and the
    message is about the file, not about memory."""
    with pytest.raises(ExtractionError, match="expands to an unreasonable size"):
        extract_in_sandbox(bomb_pdf, sandbox=SandboxLimits(memory_bytes=512 * 1024 * 1024))


def test_the_child_needs_no_django_settings(contract_pdf, monkeypatch):
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text


def test_extraction_modules_do_not_import_django():
    code = "import sys, documents.sandbox, documents.extraction, documents.ocr; print('django' in sys.modules)"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_the_child_is_found_whatever_the_working_directory(contract_pdf, tmp_path, monkeypatch):
    # A `documents` folder in the caller's working directory must not shadow the package.
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "__init__.py").write_text("")
    (tmp_path / "documents" / "sandbox.py").write_text("raise SystemExit('wrong package')\n")
    monkeypatch.chdir(tmp_path)
    assert extract_in_sandbox(contract_pdf).kind == "pdf"


def _fake_interpreter(tmp_path: Path, script: str) -> str:
    """A stand-in for the Python interpreter that the sandbox starts, doing ``script`` instead (and
    never reading the request: the parent must not hang on a child that does not)."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_a_crashing_child_is_reported_as_a_crash(contract_pdf, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", _fake_interpreter(tmp_path, "kill -SEGV $$\n"))
    with pytest.raises(ExtractionError) as excinfo:
        extract_in_sandbox(contract_pdf)
    assert str(excinfo.value) == "This file could not be read (the reader crashed)."


def test_a_child_answering_nonsense_is_reported_as_a_crash(contract_pdf, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", _fake_interpreter(tmp_path, 'echo \'{"status": "ok"}\'\n'))
    with pytest.raises(ExtractionError, match=r"the reader crashed"):
        extract_in_sandbox(contract_pdf)


def test_a_timeout_kills_the_programs_the_child_started(contract_pdf, tmp_path, monkeypatch):
    """OCR runs pdftoppm and tesseract; on timeout they must die with the child, not linger."""
    pid_file = tmp_path / "grandchild.pid"
    # Like tesseract under the OCR module, the grandchild does not hold the child's pipes.
    script = f"sleep 60 < /dev/null > /dev/null 2>&1 &\necho $! > {pid_file}\nwait\n"
    monkeypatch.setattr(sys, "executable", _fake_interpreter(tmp_path, script))
    started = time.monotonic()
    with pytest.raises(ExtractionError, match="took longer than 1 s"):
        extract_in_sandbox(contract_pdf, sandbox=SandboxLimits(timeout_s=1))
    assert time.monotonic() - started < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _is_running(grandchild):
        time.sleep(0.05)
    assert not _is_running(grandchild)


def _is_running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie waiting for its reaper is dead


@pytest.fixture(scope="module")
def scanned_pdf() -> bytes:
    return make_scanned_pdf(["The quick brown fox", "jumps over the lazy dog"])


def test_ocr_runs_in_the_sandbox(scanned_pdf):
    assert OcrEngine.available(), "install Debian's tesseract-ocr, tesseract-ocr-eng and poppler-utils"
    [page] = extract_in_sandbox(scanned_pdf, filename="scan.pdf").pages
    assert page.ocr
    assert not page.needs_ocr
    assert {"quick", "brown", "lazy"} <= set(page.text.lower().split())


def test_without_ocr_the_scanned_page_needs_ocr(scanned_pdf):
    [page] = extract_in_sandbox(scanned_pdf, filename="scan.pdf", use_ocr=False).pages
    assert page.needs_ocr
    assert page.text == ""


# --- the warm child ------------------------------------------------------------------------------


def _is_dead(pid: int, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _is_running(pid):
        time.sleep(0.02)
    return not _is_running(pid)


def test_files_in_a_row_are_read_by_the_same_child(contract_pdf):
    first = extract_in_sandbox(contract_pdf, filename="contract.pdf")
    pid = _sandbox_pid()
    assert pid is not None and pid != os.getpid()
    with pytest.raises(ExtractionError):
        extract_in_sandbox(b"plain text, but named as a PDF", filename="report.pdf")
    second = extract_in_sandbox(contract_pdf, filename="contract.pdf")
    assert _sandbox_pid() == pid
    assert first == second == extract(contract_pdf, filename="contract.pdf")


def test_a_file_read_while_another_is_gets_a_child_of_its_own(contract_pdf):
    """The ingest worker's threads read files side by side: a call takes an idle child or starts
    one, never one another call is using, and both stay warm afterwards."""
    from documents import sandbox

    extract_in_sandbox(contract_pdf)
    busy = sandbox._child_for(SandboxLimits())  # another thread's file, in the middle of its read
    try:
        assert _sandbox_pid() is None  # no idle child left
        assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text
        other = _sandbox_pid()
        assert other not in (None, busy.process.pid)
    finally:
        sandbox._give_back(busy)
    assert {child.process.pid for child in sandbox._idle} == {busy.process.pid, other}
    sandbox._shutdown()  # the other tests start from one warm child at most


def test_after_a_timeout_the_next_file_gets_a_new_child(contract_pdf):
    extract_in_sandbox(contract_pdf)
    stuck = _sandbox_pid()
    os.kill(stuck, signal.SIGSTOP)  # a warm child that never answers, like one spinning on a file
    try:
        started = time.monotonic()
        with pytest.raises(ExtractionError, match="took longer than 1 s"):
            extract_in_sandbox(contract_pdf, sandbox=SandboxLimits(timeout_s=1))
        assert time.monotonic() - started < 10
    finally:
        if _is_running(stuck):
            os.kill(stuck, signal.SIGCONT)
    assert _is_dead(stuck)
    assert _sandbox_pid() is None
    assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text
    assert _sandbox_pid() not in (None, stuck)


def test_after_a_crash_the_next_file_gets_a_new_child(contract_pdf, tmp_path, monkeypatch):
    extract_in_sandbox(contract_pdf)
    idle = _sandbox_pid()
    os.kill(idle, signal.SIGKILL)  # dies between two files
    assert _is_dead(idle)
    assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text
    assert _sandbox_pid() not in (None, idle)

    with monkeypatch.context() as patched:  # dies in the middle of a file
        patched.setattr(sys, "executable", _fake_interpreter(tmp_path, "kill -SEGV $$\n"))
        with pytest.raises(ExtractionError, match="the reader crashed"):
            extract_in_sandbox(contract_pdf)
    assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text


def test_after_running_out_of_memory_the_child_is_not_reused(bomb_pdf, contract_pdf):
    limits = SandboxLimits(memory_bytes=128 * 1024 * 1024)
    extract_in_sandbox(contract_pdf, sandbox=limits)
    before = _sandbox_pid()
    with pytest.raises(ExtractionError, match="needed more than 128 MB"):
        extract_in_sandbox(bomb_pdf, sandbox=limits)
    assert _is_dead(before)
    assert extract_in_sandbox(contract_pdf, sandbox=limits).kind == "pdf"
    assert _sandbox_pid() not in (None, before)


def test_the_child_is_retired_after_many_files(contract_pdf, monkeypatch):
    monkeypatch.setattr(sandbox_module, "MAX_FILES_PER_CHILD", 2)
    sandbox_module._shutdown()
    extract_in_sandbox(contract_pdf)
    first = _sandbox_pid()
    extract_in_sandbox(contract_pdf)  # its second file: then it is retired
    assert _sandbox_pid() is None
    assert _is_dead(first)
    extract_in_sandbox(contract_pdf)
    assert _sandbox_pid() not in (None, first)


def test_the_child_has_a_minimal_environment_and_its_own_process_group(contract_pdf, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/appliance")
    sandbox_module._shutdown()
    extract_in_sandbox(contract_pdf)
    pid = _sandbox_pid()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not any(item.startswith(b"DATABASE_URL=") for item in environ)
    assert os.getpgid(pid) == pid != os.getpgid(0)


def test_a_forked_process_does_not_reuse_its_parents_child(contract_pdf):
    extract_in_sandbox(contract_pdf)
    parents_child = _sandbox_pid()
    read_end, write_end = os.pipe()
    forked = os.fork()
    if forked == 0:  # pragma: no cover - the forked process: report, then leave without pytest
        status = 1
        try:
            os.close(read_end)
            inherited = _sandbox_pid()
            pages = extract_in_sandbox(contract_pdf).pages
            own = _sandbox_pid()
            own_parent = int(Path(f"/proc/{own}/stat").read_text().rsplit(")", 1)[1].split()[1])
            os.write(write_end, f"{inherited} {own} {own_parent} {'Northwind' in pages[0].text}".encode())
            sandbox_module._shutdown()
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        report = reader.read().decode()
    _, status = os.waitpid(forked, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    inherited, own, own_parent, read_it = report.split()
    assert inherited == "None"
    assert int(own) != parents_child
    assert int(own_parent) == forked
    assert read_it == "True"
    # The parent's child was left alone and still serves the parent.
    assert _sandbox_pid() == parents_child
    assert "Northwind" in extract_in_sandbox(contract_pdf).pages[0].text
    assert _sandbox_pid() == parents_child


def test_the_child_exits_when_its_caller_goes(tmp_path):
    """A caller that dies (killed, so no clean-up runs) leaves no child behind."""
    code = (
        "import os, signal, sys\n"
        "from documents.sandbox import extract_in_sandbox, _sandbox_pid\n"
        "from tests.pdfs import CONTRACT_PAGES, make_pdf\n"
        "extract_in_sandbox(make_pdf(CONTRACT_PAGES))\n"
        "print(_sandbox_pid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert _is_dead(int(result.stdout))
