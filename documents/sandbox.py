"""Extraction in a child process with a time limit and a memory limit.

A hostile or broken file can make a parser spin or allocate without end; in a child process that
costs only the child. The child is ``python -m documents.sandbox``: a plain subprocess, because the
caller is a Celery prefork child (a daemonic process, which multiprocessing refuses to give
children) and because a fresh interpreter shares no state with the worker.

Protocol: the parent writes a 4-byte big-endian length, a JSON header (options) and the file's
bytes to the child's stdin; the child writes one JSON object to its stdout. JSON, not pickle: the
child parses hostile input, so the parent must not run code the child could choose.

The child sets RLIMIT_AS (memory) and RLIMIT_CPU before it reads the file, and needs no Django
settings (``documents.extraction`` is pure). Programs it starts (pdftoppm, tesseract) inherit the
limits; the parent kills the child's whole process group on timeout.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import signal
import subprocess
import sys
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


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 120.0
    memory_bytes: int = 1536 * 1024 * 1024


DEFAULT_SANDBOX_LIMITS = SandboxLimits()


_CHILD_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "HOME", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TESSDATA_PREFIX")


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
            "memory_bytes": sandbox.memory_bytes,
            "cpu_s": max(1, math.ceil(sandbox.timeout_s)),
            "use_ocr": use_ocr,
        }
    ).encode()
    # The child that parses hostile bytes gets no secrets: none of the worker's environment
    # (DATABASE_URL, REDIS_URL, keys) beyond what Python and the OCR programs need.
    env = {name: os.environ[name] for name in _CHILD_ENV if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, os.environ.get("PYTHONPATH")]))
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "documents.sandbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=_IMPORT_ROOT,  # `-m` puts the working directory first on sys.path: make it ours
            start_new_session=True,  # its own process group, so that a timeout kills OCR programs too
        )
    except OSError as exc:
        logger.error("extraction sandbox could not start: %s", exc)
        raise ExtractionError("This file could not be read (the reader could not be started).") from exc
    try:
        stdout, stderr = process.communicate(len(header).to_bytes(4, "big") + header + data, timeout=sandbox.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        raise ExtractionError(_timeout_message(sandbox)) from None
    except BaseException:
        _kill_group(process)
        process.communicate()
        raise
    return _result(process.returncode, stdout, stderr, sandbox)


def _kill_group(process: subprocess.Popen) -> None:
    # The child is not reaped yet, so its process group id cannot have been reused.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _timeout_message(sandbox: SandboxLimits) -> str:
    return f"Reading this file took longer than {sandbox.timeout_s:g} s; it may be damaged or far too large."


def _memory_message(sandbox: SandboxLimits) -> str:
    megabytes = sandbox.memory_bytes // (1024 * 1024)
    return f"Reading this file needed more than {megabytes} MB of memory; it may be damaged or far too large."


_CRASHED_MESSAGE = "This file could not be read (the reader crashed)."
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "failed to map segment")


def _result(returncode: int, stdout: bytes, stderr: bytes, sandbox: SandboxLimits) -> ExtractedDocument:
    report = None
    if stdout:
        try:
            report = json.loads(stdout)
        except ValueError:
            report = None
    if isinstance(report, dict):
        status = report.get("status")
        if status == "ok":
            try:
                return _document_from_json(report["document"])
            except (KeyError, TypeError, ValueError) as exc:
                logger.error("extraction sandbox sent a malformed document: %r", exc)
                raise ExtractionError(_CRASHED_MESSAGE) from exc
        if status == "error" and isinstance(report.get("message"), str):
            raise ExtractionError(report["message"])
        if status == "memory":
            raise ExtractionError(_memory_message(sandbox))
    detail = stderr.decode("utf-8", errors="replace")[-2000:]
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not any(sign in detail for sign in _MEMORY_SIGNS):
        if returncode == -signal.SIGXCPU:  # the CPU limit, a second after the time limit
            raise ExtractionError(_timeout_message(sandbox))
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


def _limit_resources(memory_bytes: int, cpu_s: int) -> None:
    import resource

    # CPU: SIGXCPU at the soft limit, SIGKILL a second later should that signal be caught.
    for kind, soft, hard in ((resource.RLIMIT_AS, memory_bytes, memory_bytes), (resource.RLIMIT_CPU, cpu_s, cpu_s + 1)):
        _, current_hard = resource.getrlimit(kind)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(kind, (soft, hard))


def _child_main() -> int:
    # Our report goes to the real stdout; anything a library prints goes to stderr instead.
    report_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        report = _child_extract()
        payload = json.dumps(report).encode()
    except MemoryError:
        payload = b'{"status": "memory"}'
    try:
        with os.fdopen(report_fd, "wb") as out:
            out.write(payload)
    except MemoryError:
        return _EXIT_MEMORY
    return 0


def _child_extract() -> dict:
    stdin = sys.stdin.buffer
    header_length = int.from_bytes(stdin.read(4), "big")
    header = json.loads(stdin.read(header_length))
    _limit_resources(int(header["memory_bytes"]), int(header["cpu_s"]))
    data = stdin.read()
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
    sys.exit(_child_main())
