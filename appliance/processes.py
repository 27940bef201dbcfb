"""Starting and stopping the appliance's processes, one way for all who do it: ``manage.py
serve``'s supervisor, the test fixtures, the benchmarks, the spec sheet and the evaluation start
what ``appliance.supervisor.appliance_processes`` declares with ``start_appliance_processes`` (or
one command line with ``start``) and stop it with ``stop_groups``.

Each process leads a process group of its own, so that stopping it stops what it started (vLLM's
engine core, a worker pool's children); the supervisor and the test fixtures also have Linux send
it SIGTERM when they die (``die_with_parent``), so that nothing outlives a killed parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("appliance.processes")

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to send SIGTERM to the child if the process that started it is killed. (Linux
    counts the parent *thread*: start such children from a thread that lives as long as they do.)"""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def start(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    log_path: Path | None = None,
    fresh_log: bool = False,
    tie_to_parent: bool = False,
    cpus: frozenset[int] | None = None,
) -> subprocess.Popen[bytes]:
    """``argv`` in a process group of its own; its output appended to ``log_path`` (written
    anew with ``fresh_log``), or left on this process's own when there is none; on ``cpus``
    (``appliance.cpus``), or anywhere."""

    def before_exec() -> None:  # pragma: no cover - runs in the child before exec
        if tie_to_parent:
            die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    options: dict[str, Any] = {
        "cwd": cwd,
        "env": dict(env),
        "start_new_session": True,
        "preexec_fn": before_exec if tie_to_parent or cpus else None,
    }
    if log_path is None:
        return subprocess.Popen(list(argv), **options)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb" if fresh_log else "ab") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, **options)


def start_appliance_processes(
    names: Collection[str],
    *,
    settings: Any,
    env: Mapping[str, str],
    log_dir: Path,
    port: int = 0,
    tag: str | None = None,
    fresh_log: bool = False,
    tie_to_parent: bool = False,
) -> list[subprocess.Popen[bytes]]:
    """The processes of ``make run`` called ``names``, with its command lines (pool sizes from
    ``settings``), each logging to ``log_dir/<name>.log``. ``tag``: each worker is named
    ``<queue>-<tag>@host``, told apart from the appliance's own."""
    from appliance.supervisor import appliance_processes

    specs = appliance_processes(python=sys.executable, port=port, settings=settings)
    unknown = set(names) - {spec.name for spec in specs}
    if unknown:
        raise ValueError(f"no such appliance process: {', '.join(sorted(unknown))}")
    return [
        start(
            [a.replace("@%h", f"-{tag}@%h") for a in spec.argv] if tag else spec.argv,
            cwd=settings.BASE_DIR,
            env={**env, **spec.env},
            log_path=log_dir / f"{spec.name}.log",
            fresh_log=fresh_log,
            tie_to_parent=tie_to_parent,
            cpus=spec.cpus,
        )
        for spec in specs
        if spec.name in names
    ]


def stop_groups(
    processes: Sequence[subprocess.Popen[bytes]],
    *,
    timeout_s: float = 30,
    grace_s: float = 10,
    names: Sequence[str] | None = None,
) -> None:
    """SIGTERM each process group (in the order given), then SIGKILL a group whose leader has not
    exited within ``timeout_s`` of that. A group can outlive its leader when a child ignores the
    signal (vLLM's engine core while it compiles, when an engine host is stopped during its
    start): it is given ``grace_s`` more, then killed, so that no engine is left holding the
    device. Returns once every group is gone (or killed and reaped)."""
    labels = list(names) if names is not None else [f"pid {p.pid}" for p in processes]
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process, label in zip(processes, labels, strict=True):
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0f s; killing it", label, timeout_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + grace_s
    for process in processes:
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            # A killed orphan is gone once init has reaped it: wait for that, a few seconds at most.
            gone_by = time.monotonic() + 5
            while _group_alive(process.pid) and time.monotonic() < gone_by:
                time.sleep(0.05)


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to ``process``'s group, if there is still one (and it is ours to signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


@contextlib.contextmanager
def held(processes: Sequence[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Each process's group stopped where it is (SIGSTOP) for the block and continued after: it
    runs nothing and takes no CPU meanwhile, with its work, queue and connections as they were."""
    for process in processes:
        signal_group(process, signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            signal_group(process, signal.SIGCONT)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_tree(pid: int, *, timeout_s: float = 30) -> None:
    """SIGKILL a process and everything it started, at once: a machine that loses power, not one
    that shuts down (the benchmarks' and tests' lost node)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=timeout_s)
