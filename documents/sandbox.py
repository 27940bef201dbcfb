"""Extraction in a child process with a time limit and a memory limit.

A hostile or broken file can make a parser spin or allocate without end; in a child process that
costs only the child. The child is ``python -m documents.sandbox``: a plain subprocess, because the
caller is a Celery prefork child (a daemonic process, which multiprocessing refuses to give
children) and because a fresh interpreter shares no state with the worker.

The child is warm: a long-lived child, started on first use, imports the extraction modules once
and then serves one file after another (starting an interpreter and importing pypdf for every
file cost about 0.17 s a file). A process whose threads extract at once (the ingest worker's
pool) gets a warm child per thread that extracts: a call takes an idle child or starts one, and
gives it back when the file is done, so files are read side by side, each in a child of its own,
and never more children than calls at once (at most ``MAX_IDLE_CHILDREN`` stay warm). Whatever goes wrong with a file (time
limit, crash, memory, a broken pipe, an answer that breaks the protocol) the parent kills the
child's whole process group, and the next call starts a fresh child. A child is also retired after
``MAX_FILES_PER_CHILD`` files and after any file that ran out of memory, so that nothing one file
leaves behind (memory creep, a parser's cache) lives long.

Protocol, per file: the parent writes a 4-byte big-endian length, a JSON header (options and the
file's size) and the file's bytes to the child's stdin; the child answers with a 4-byte big-endian
length and one JSON object on its stdout. JSON, not pickle: the child parses hostile input, so the
parent must not run code the child could choose. The child exits at end of file on its stdin.

Before it reads a file the child confines itself (``documents/confinement.py``): no network (a
network namespace of its own), limits on open files, file size, core dumps and processes, and
Landlock: a read-only file system where Python and the OCR programs live, writes only in a
temporary directory of its own, nothing of ``var/`` (secret key, credentials, database, uploads).
Every answer carries what held (``confinement``); the parent logs what did not, once.

The child sets RLIMIT_AS (memory) once, when it starts; programs it starts (pdftoppm, tesseract)
inherit it. The time limit is a wall-clock limit per file, kept by the parent (no RLIMIT_CPU: that
one adds up over every file the child serves). The child needs no Django settings
(``documents.extraction`` is pure), gets none of the worker's environment beyond what it needs, and
runs in its own process group. It does not outlive the caller: it exits at end of file on its
stdin, and Linux kills it when the caller dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from documents.extraction import (
    DEFAULT_LIMITS,
    Attachment,
    ExtractedDocument,
    ExtractedPage,
    ExtractionError,
    ExtractionLimits,
)

logger = logging.getLogger(__name__)

# The directory that holds the `documents` package, for the child's sys.path.
_IMPORT_ROOT = str(Path(__file__).resolve().parent.parent)
_EXIT_MEMORY = 3  # the child's exit status when memory ran out before it could report
MAX_FILES_PER_CHILD = 200  # then a fresh child, so that slow memory creep cannot build up
MAX_IDLE_CHILDREN = 8  # warm children kept between files; more at once are retired when done
_MAX_REPLY_BYTES = 1 << 31  # more than any child within its memory limit can send
_STDERR_TAIL_BYTES = 64 * 1024  # what is kept of the child's stderr for one file


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120.0
    memory_bytes: int = 1536 * 1024 * 1024


DEFAULT_SANDBOX_LIMITS = SandboxLimits()


_CHILD_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "HOME",
    "TMPDIR",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "TESSDATA_PREFIX",
)


def extract_in_sandbox(
    data: bytes,
    *,
    filename: str = "",
    content_type: str = "",
    limits: ExtractionLimits = DEFAULT_LIMITS,
    sandbox: SandboxLimits = DEFAULT_SANDBOX_LIMITS,
    use_ocr: bool = True,
) -> ExtractedDocument:
    """``extraction.extract`` in a child process. Raises only ExtractionError."""
    header = json.dumps(
        {
            "filename": filename,
            "content_type": content_type,
            "limits": {
                "max_pages": limits.max_pages,
                "max_chars": limits.max_chars,
                "max_attachments": limits.max_attachments,
                "max_uncompressed_bytes": limits.max_uncompressed_bytes,
            },
            "use_ocr": use_ocr,
            "size": len(data),
        }
    ).encode()
    request = len(header).to_bytes(4, "big") + header + data
    # The time limit counts from here: a child started for this file starts on its time.
    deadline = time.monotonic() + sandbox.timeout_s
    child = _child_for(sandbox)
    try:
        return _extract_with(child, request, deadline, sandbox)
    finally:
        _give_back(child)


def _extract_with(child: _Child, request: bytes, deadline: float, sandbox: SandboxLimits) -> ExtractedDocument:
    """One file through ``child``, which is this call's alone; a child that cannot serve another
    file is retired here (``_give_back`` then leaves it)."""
    try:
        payload, stderr = child.exchange(request, deadline)
    except _TimedOut:
        _retire(child)
        raise ExtractionError(_timeout_message(sandbox)) from None
    except _ChildGone as gone:
        returncode = child.reap(deadline)  # None: still running at the deadline
        child.kill_group()
        stderr = gone.stderr + child.rest_of_stderr()
        _retire(child)
        if returncode is None:
            raise ExtractionError(_timeout_message(sandbox)) from None
        _raise_for_exit(returncode, stderr, sandbox)
    except _ProtocolError as exc:
        _retire(child)
        logger.error("extraction sandbox broke the protocol: %s", exc)
        raise ExtractionError(_CRASHED_MESSAGE) from None
    except BaseException:
        _retire(child)  # interrupted in the middle of an exchange (a Celery time limit)
        raise
    child.files_served += 1
    try:
        report = json.loads(payload)
    except ValueError:
        report = None
    status = report.get("status") if isinstance(report, dict) else None
    if isinstance(report, dict):
        _note_confinement(report.get("confinement"))
    if child.files_served >= MAX_FILES_PER_CHILD:
        _retire(child)
    if status == "ok":
        try:
            return _document_from_json(report["document"])
        except (KeyError, TypeError, ValueError) as exc:
            _retire(child)
            logger.error("extraction sandbox sent a malformed document: %r", exc)
            raise ExtractionError(_CRASHED_MESSAGE) from exc
    if status == "error" and isinstance(report.get("message"), str):
        raise ExtractionError(report["message"])
    # After a memory error the child may be half-way through anything: it is not reused.
    _retire(child)
    if status == "memory":
        raise ExtractionError(_memory_message(sandbox))
    detail = stderr.decode("utf-8", errors="replace")[-2000:]
    logger.error("extraction sandbox broke the protocol (answer %r): %s", payload[:200], detail)
    raise ExtractionError(_CRASHED_MESSAGE)


# --- the parent's side of the child --------------------------------------------------------------


class _TimedOut(Exception):
    pass


class _ProtocolError(Exception):
    pass


class _ChildGone(Exception):
    """The child closed its stdout (it exited or is exiting) before answering in full."""

    def __init__(self, stderr: bytes):
        super().__init__("the extraction child went away")
        self.stderr = stderr


class _Child:
    def __init__(self, process: subprocess.Popen[bytes], memory_bytes: int, temp_dir: str):
        if process.stdin is None or process.stdout is None or process.stderr is None:
            raise ValueError("a sandbox child talks over pipes: start it with stdin, stdout and stderr=PIPE")
        self.process = process
        self.stdin, self.stdout, self.stderr = process.stdin, process.stdout, process.stderr
        self.memory_bytes = memory_bytes
        self.temp_dir = temp_dir  # the only place the child may write; removed with it
        self.executable = sys.executable
        self.owner_pid = os.getpid()
        self.files_served = 0
        self.retired = False
        for stream in (self.stdin, self.stdout, self.stderr):
            os.set_blocking(stream.fileno(), False)

    def usable_for(self, sandbox: SandboxLimits) -> bool:
        return (
            self.owner_pid == os.getpid()
            and self.memory_bytes == sandbox.memory_bytes
            and self.executable == sys.executable
            # Dead while idle: PR_SET_PDEATHSIG fires when the *thread* that started the child
            # ends, so a caller whose first call came from a thread that is gone finds it dead.
            and self.process.poll() is None
        )

    def exchange(self, request: bytes, deadline: float) -> tuple[bytes, bytes]:
        """Send one request, return (answer, the child's stderr meanwhile). Raises _TimedOut at
        the deadline, _ChildGone when the child closes its stdout, _ProtocolError on a bad frame."""
        stdin, stdout, stderr = (s.fileno() for s in (self.stdin, self.stdout, self.stderr))
        _read_available(stderr)  # what the child printed between files (at start-up) is not this file's
        stderr_tail = bytearray()
        reply = bytearray()
        sent = 0
        view = memoryview(request)
        with selectors.DefaultSelector() as selector:
            selector.register(stdin, selectors.EVENT_WRITE)
            selector.register(stdout, selectors.EVENT_READ)
            selector.register(stderr, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _TimedOut
                for key, _ in selector.select(remaining):
                    if key.fd == stdin:
                        try:
                            sent += os.write(stdin, view[sent : sent + (1 << 20)])
                        except BlockingIOError:
                            continue
                        except OSError:  # a broken pipe: the child is gone; its stdout will say so
                            selector.unregister(stdin)
                            continue
                        if sent == len(request):
                            selector.unregister(stdin)
                    elif key.fd == stderr:
                        chunk = _read(stderr)
                        if chunk is None:
                            continue
                        if not chunk:
                            selector.unregister(stderr)
                            continue
                        stderr_tail += chunk
                        del stderr_tail[:-_STDERR_TAIL_BYTES]
                    else:
                        chunk = _read(stdout)
                        if chunk is None:
                            continue
                        if not chunk:
                            raise _ChildGone(bytes(stderr_tail))
                        reply += chunk
                        if len(reply) >= 4:
                            length = int.from_bytes(reply[:4], "big")
                            if length > _MAX_REPLY_BYTES or len(reply) > 4 + length:
                                raise _ProtocolError(f"an answer of {length} bytes, {len(reply) - 4} sent")
                            if len(reply) == 4 + length:
                                stderr_tail += _read_available(stderr)
                                return bytes(reply[4:]), bytes(stderr_tail)

    def reap(self, deadline: float) -> int | None:
        """The exit status of a child that closed its stdout, waiting for it until the deadline;
        None if it is still running then. The child is left unreaped (waitid's WNOWAIT), so that
        its process group id cannot be reused before _retire kills the group."""
        pid = self.process.pid
        while True:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return self.process.wait()
            if info is not None:
                if info.si_code == os.CLD_EXITED:
                    return info.si_status
                return -info.si_status  # killed or dumped by a signal: Popen's convention
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def kill_group(self) -> None:
        """Kill the child's process group: the child and the programs it started."""
        if self.process.returncode is None:
            # The child is not reaped yet, so its process group id cannot have been reused.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def rest_of_stderr(self) -> bytes:
        """What the child wrote to stderr before it died (a trace): call after kill_group."""
        return _read_until_eof(self.stderr.fileno(), time.monotonic() + 1.0)

    def stop(self) -> None:
        """Kill the child's process group and reap the child."""
        process = self.process
        self.kill_group()
        for stream in (self.stdin, self.stdout, self.stderr):
            try:
                stream.close()
            except OSError:
                pass
        process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def forget(self) -> None:
        """In a forked copy of the owner: close our copies of the pipes, leave the child alone."""
        for stream in (self.stdin, self.stdout, self.stderr):
            try:
                stream.close()  # unbuffered: closes our copy of the descriptor, nothing else
            except OSError:
                pass


def _read(fd: int) -> bytes | None:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return None


def _read_available(fd: int) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        out += chunk
        del out[:-_STDERR_TAIL_BYTES]
    return bytes(out)


def _read_until_eof(fd: int, deadline: float) -> bytes:
    out = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0 and selector.select(remaining):
            chunk = _read(fd)
            if chunk is None:
                continue
            if not chunk:
                break
            out += chunk
            del out[:-_STDERR_TAIL_BYTES]
    return bytes(out)


_lock = threading.Lock()  # guards _idle only: each exchange has its child to itself
_idle: list[_Child] = []  # warm children no call is using, the one given back last at the end
_forgotten: list[_Child] = []  # children of the process we were forked from: not ours to reap


def _child_for(sandbox: SandboxLimits) -> _Child:
    """An idle warm child fit for these limits (the one given back last), or a new one; the
    caller's alone until ``_give_back``. Idle children unfit for these limits are retired."""
    unfit: list[_Child] = []
    found = None
    with _lock:
        while _idle:
            child = _idle.pop()
            if child.usable_for(sandbox):
                found = child
                break
            unfit.append(child)
    for child in unfit:
        _retire(child)
    return found if found is not None else _start_child(sandbox.memory_bytes)


def _give_back(child: _Child) -> None:
    """``child`` is idle again, unless it was retired (or this process is a fork of its owner)."""
    if child.retired or child.owner_pid != os.getpid():
        return
    with _lock:
        if len(_idle) < MAX_IDLE_CHILDREN:
            _idle.append(child)
            return
    _retire(child)


def _start_child(memory_bytes: int) -> _Child:
    # The child that parses hostile bytes gets no secrets: none of the worker's environment
    # (DATABASE_URL, REDIS_URL, keys) beyond what Python and the OCR programs need.
    env = {name: os.environ[name] for name in _CHILD_ENV if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))
    temp_dir = tempfile.mkdtemp(prefix="appliance-extraction-")
    env["TMPDIR"] = temp_dir
    env[_PROTECTED_ENV] = os.pathsep.join(_protected_paths())
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "documents.sandbox", str(memory_bytes), str(os.getpid()), temp_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env,
            cwd=_IMPORT_ROOT,  # `-m` puts the working directory first on sys.path: make it ours
            start_new_session=True,  # its own process group, so that a kill stops OCR programs too
        )
    except OSError as exc:
        shutil.rmtree(temp_dir, ignore_errors=True)
        logger.error("extraction sandbox could not start: %s", exc)
        raise ExtractionError("This file could not be read (the reader could not be started).") from exc
    return _Child(process, memory_bytes, temp_dir)


def _retire(child: _Child) -> None:
    """Kill and reap ``child`` (not idle: its caller's, or taken from the idle ones)."""
    child.retired = True
    child.stop()


_confinement: dict | None = None  # what the last child reported (for tests and diagnostics)
_confinement_problems_logged: set[str] = set()


def _note_confinement(value) -> None:
    global _confinement
    if not isinstance(value, dict):
        return
    _confinement = value
    for problem in value.get("problems") or []:
        if isinstance(problem, str) and problem not in _confinement_problems_logged:
            _confinement_problems_logged.add(problem)
            logger.warning("extraction sandbox: one layer of its confinement is missing here: %s", problem)


def last_confinement() -> dict | None:
    """What the last child said of its confinement (``documents.confinement.Confinement``)."""
    return _confinement


def _sandbox_pid() -> int | None:
    """The pid of the warm child the next call takes, if there is one (for tests and diagnostics)."""
    with _lock:
        child = _idle[-1] if _idle else None
    if child is None or child.owner_pid != os.getpid() or child.process.poll() is not None:
        return None
    return child.process.pid


def _after_fork_in_child() -> None:
    # A forked process (a Celery prefork child) must not share its parent's children: the pipes
    # would interleave two conversations. It also gets a fresh lock, in case another thread held it.
    global _lock
    _lock = threading.Lock()
    for child in _idle:
        child.forget()
        _forgotten.append(child)
    _idle.clear()


def _shutdown() -> None:
    with _lock:
        children = [child for child in _idle if child.owner_pid == os.getpid()]
        _idle.clear()
    for child in children:
        _retire(child)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown)


def _timeout_message(sandbox: SandboxLimits) -> str:
    return f"Reading this file took longer than {sandbox.timeout_s:g} s; it may be damaged or far too large."


def _memory_message(sandbox: SandboxLimits) -> str:
    megabytes = sandbox.memory_bytes // (1024 * 1024)
    return f"Reading this file needed more than {megabytes} MB of memory; it may be damaged or far too large."


_CRASHED_MESSAGE = "This file could not be read (the reader crashed)."
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "failed to map segment")


def _raise_for_exit(returncode: int, stderr: bytes, sandbox: SandboxLimits):
    """The child died in the middle of a file without a proper answer."""
    detail = stderr.decode("utf-8", errors="replace")[-2000:]
    if returncode == -signal.SIGKILL and not any(sign in detail for sign in _MEMORY_SIGNS):
        # Killed by someone else: the kernel's OOM killer is the usual one.
        raise ExtractionError(_memory_message(sandbox))
    if returncode == _EXIT_MEMORY or any(sign in detail for sign in _MEMORY_SIGNS):
        raise ExtractionError(_memory_message(sandbox))
    logger.error("extraction sandbox crashed (exit status %s): %s", returncode, detail)
    raise ExtractionError(_CRASHED_MESSAGE)


def _document_to_json(document: ExtractedDocument) -> dict:
    return {
        "kind": document.kind,
        "title": document.title,
        "pages": [[page.text, page.needs_ocr, page.ocr] for page in document.pages],
        "attachments": [
            {
                "filename": attachment.filename,
                "content_type": attachment.content_type,
                "data": base64.b64encode(attachment.data).decode("ascii"),
            }
            for attachment in document.attachments
        ],
    }


def _document_from_json(value: dict) -> ExtractedDocument:
    return ExtractedDocument(
        kind=str(value["kind"]),
        title=None if value["title"] is None else str(value["title"]),
        pages=[
            ExtractedPage(text=str(text), needs_ocr=bool(needs_ocr), ocr=bool(ocr))
            for text, needs_ocr, ocr in value["pages"]
        ],
        attachments=[
            Attachment(
                filename=str(item["filename"]),
                content_type=str(item["content_type"]),
                data=base64.b64decode(item["data"], validate=True),
            )
            for item in value["attachments"]
        ],
    )


# --- the child -----------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_MEMORY_REPLY = b'{"status": "memory"}'
_MEMORY_FRAME = len(_MEMORY_REPLY).to_bytes(4, "big") + _MEMORY_REPLY  # made before memory is short


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill us when the caller dies (even mid-file, when we are not reading stdin)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # it died before we asked
        os._exit(0)


def _limit_memory(memory_bytes: int) -> None:
    import resource

    soft = hard = memory_bytes
    _, current_hard = resource.getrlimit(resource.RLIMIT_AS)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _preload() -> None:
    """Import once what every file needs; under a tiny memory limit a file's own import reports."""
    try:
        import charset_normalizer  # noqa: F401
        import pypdf  # noqa: F401
        import pypdf.errors  # noqa: F401
        import pypdf.generic  # noqa: F401

        from documents.ocr import OcrEngine

        OcrEngine.available()
    except (ImportError, MemoryError):
        pass


_CHILD_CONFINEMENT: dict = {}
_PROTECTED_ENV = "APPLIANCE_SANDBOX_PROTECTED"


def _protected_paths() -> list[str]:
    """What no grant of the child may cover: the appliance's var/ (from the Django settings when
    the caller has them) and the project directory itself."""
    paths = [_IMPORT_ROOT]
    try:
        from django.conf import settings

        paths.append(str(settings.VAR_DIR))
    except Exception as exc:  # noqa: BLE001 - no Django settings here (a script): the project directory only
        logger.debug("extraction sandbox: no settings to read var/ from (%s)", exc)
    return paths


def _child_main(argv: list[str]) -> int:
    memory_bytes, parent_pid, temp_dir = int(argv[0]), int(argv[1]), argv[2]
    _die_with_parent(parent_pid)
    from documents.confinement import confine

    tempfile.tempdir = temp_dir
    tessdata = os.environ.get("TESSDATA_PREFIX")
    _CHILD_CONFINEMENT.update(
        confine(
            import_root=_IMPORT_ROOT,
            temp_dir=temp_dir,
            extra_read_paths=(tessdata,) if tessdata else (),
            protected=tuple(filter(None, os.environ.get(_PROTECTED_ENV, "").split(os.pathsep))),
        ).to_dict()
    )
    # Requests come on a private copy of stdin and answers go on a private copy of stdout: what a
    # library prints goes to stderr, and the programs it starts read /dev/null, not our requests.
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    _limit_memory(memory_bytes)
    _preload()
    while True:
        try:
            prefix = requests.read(4)
            if len(prefix) < 4:
                return 0  # the caller closed the pipe (or died): done
            header = json.loads(_read_exactly(requests, int.from_bytes(prefix, "big")))
            data = _read_exactly(requests, int(header["size"]))
            report = _child_extract(header, data)
            report["confinement"] = _CHILD_CONFINEMENT
            del data
            payload = json.dumps(report).encode()
            frame = len(payload).to_bytes(4, "big") + payload
            del payload
        except MemoryError:
            report, frame = {"status": "memory"}, _MEMORY_FRAME
        try:
            _write_all(answers, frame)
        except MemoryError:
            return _EXIT_MEMORY
        except OSError:
            return 0  # the caller is gone
        if report.get("status") == "memory":
            return 0  # the parent retires us anyway; leave no half-broken state serving files


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise SystemExit("extraction sandbox: the request ended early")
    return data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _child_extract(header: dict, data: bytes) -> dict:
    try:
        from documents.extraction import extract
        from documents.ocr import default_ocr_engine

        document = extract(
            data,
            filename=header["filename"],
            content_type=header["content_type"],
            limits=ExtractionLimits(**header["limits"]),
            ocr=default_ocr_engine() if header["use_ocr"] else None,
        )
    except ExtractionError as exc:
        return {"status": "error", "message": str(exc)}
    except MemoryError:
        return {"status": "memory"}
    except ImportError as exc:
        # A module loaded late (pypdf, charset-normalizer) that cannot be mapped under the limit.
        if any(sign in str(exc) for sign in _MEMORY_SIGNS):
            return {"status": "memory"}
        raise
    return {"status": "ok", "document": _document_to_json(document)}


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
