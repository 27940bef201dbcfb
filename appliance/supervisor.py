"""The single-box supervisor behind ``make run`` (``manage.py serve``).

It starts the embedded services when no external ones are configured, prepares the model,
migrates, makes sure an administrator exists, then starts and watches the processes of the
appliance: the ASGI web server, the engine host and one Celery worker pool per queue. A process
that dies is started again (with a growing pause if it keeps dying); Ctrl-C or SIGTERM stops
them all, newest first, then the embedded services it started.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("appliance.supervisor")

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to send SIGTERM to the child if the supervisor itself is killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Running:
    spec: ProcessSpec
    process: subprocess.Popen
    started_at: float
    restarts: int = 0
    next_start_at: float | None = None


def appliance_processes(*, python: str, port: int, settings) -> list[ProcessSpec]:
    manage = [python, str(Path(settings.BASE_DIR) / "manage.py")]
    celery = [
        python,
        "-m",
        "celery",
        "-A",
        "appliance",
        "worker",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    return [
        ProcessSpec("engine", [*manage, "engine_host"]),
        ProcessSpec(
            "ingest-worker",
            [
                *celery,
                "-Q",
                "ingest",
                "-n",
                "ingest@%h",
                "--pool",
                "prefork",
                "-c",
                str(settings.APPLIANCE_INGEST_CONCURRENCY),
                "--max-tasks-per-child",
                "50",
            ],
        ),  # fmt: skip
        ProcessSpec(
            "prefill-worker",
            [
                *celery,
                "-Q",
                "prefill",
                "-n",
                "prefill@%h",
                "--pool",
                "threads",
                "-c",
                str(settings.APPLIANCE_PREFILL_CONCURRENCY),
            ],
        ),
        ProcessSpec(
            "decode-worker",
            [
                *celery,
                "-Q",
                "decode",
                "-n",
                "decode@%h",
                "--pool",
                "threads",
                "-c",
                str(settings.APPLIANCE_DECODE_CONCURRENCY),
            ],
        ),
        ProcessSpec(
            "web",
            [
                python,
                "-m",
                "uvicorn",
                "appliance.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--timeout-graceful-shutdown",
                "5",
            ],
        ),  # fmt: skip
    ]


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], *, cwd: Path, max_backoff_s: float = 30.0) -> None:
        self.specs = specs
        self.cwd = cwd
        self.max_backoff_s = max_backoff_s
        self.running: dict[str, _Running] = {}
        self.stopping = False

    def _spawn(self, spec: ProcessSpec) -> subprocess.Popen:
        logger.info("starting %s", spec.name)
        return subprocess.Popen(
            spec.argv,
            cwd=self.cwd,
            env={**os.environ, **spec.env},
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children in order
            preexec_fn=die_with_parent,
        )

    def start_all(self) -> None:
        for spec in self.specs:
            self.running[spec.name] = _Running(spec, self._spawn(spec), time.monotonic())

    def poll_once(self) -> None:
        """Restart what died; a process that dies within a minute of starting waits longer each time."""
        now = time.monotonic()
        for entry in self.running.values():
            if entry.next_start_at is not None:
                if now >= entry.next_start_at and not self.stopping:
                    entry.process = self._spawn(entry.spec)
                    entry.started_at, entry.next_start_at = now, None
                continue
            code = entry.process.poll()
            if code is None or self.stopping:
                continue
            _signal_group(entry.process, signal.SIGKILL)  # what it left behind (vLLM's engine core)
            lived = now - entry.started_at
            entry.restarts = 0 if lived > 60 else entry.restarts + 1
            pause = min(self.max_backoff_s, 2.0**entry.restarts) if entry.restarts else 0.5
            logger.error(
                "%s exited with code %s after %.0f s; starting it again in %.1f s", entry.spec.name, code, lived, pause
            )
            entry.next_start_at = now + pause

    def stop_all(self, timeout_s: float = 30.0) -> None:
        self.stopping = True
        entries = [e for e in reversed(list(self.running.values())) if e.process.poll() is None]
        for entry in entries:
            logger.info("stopping %s", entry.spec.name)
            _signal_group(entry.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for entry in entries:
            try:
                entry.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", entry.spec.name)
                _signal_group(entry.process, signal.SIGKILL)
                entry.process.wait()
            # Whatever the process left behind in its group (vLLM's engine core, pool children).
            _signal_group(entry.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
