"""Starting and stopping the appliance's processes (``appliance/processes.py``), the one way the
supervisor, the test fixtures, the benchmarks and the evaluation do it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.processes import held, start, start_appliance_processes, stop_groups
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent.parent


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_group_whose_child_ignores_the_signal_is_killed_after_its_leader_exits():
    # The leader exits on SIGTERM; its child ignores it, as vLLM's engine core does while it
    # compiles the model when an engine host is stopped during its start.
    leader = subprocess.Popen(
        ["sh", "-c", "(trap '' TERM; sleep 60) & sleep 60"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        stop_groups([leader], timeout_s=10, grace_s=0.5)
        assert leader.returncode is not None
        assert not _group_alive(leader.pid)
    finally:
        if _group_alive(leader.pid):
            os.killpg(leader.pid, 9)


def test_stopping_a_process_that_has_already_exited_is_quiet():
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    stop_groups([done], timeout_s=1, grace_s=0.1)
    assert done.returncode == 0


def test_a_started_process_leads_its_own_group_and_writes_its_log(tmp_path):
    log = tmp_path / "logs" / "echo.log"
    log.parent.mkdir()
    log.write_bytes(b"before\n")
    process = start(["sh", "-c", "echo one; echo two >&2"], cwd=tmp_path, env=os.environ, log_path=log)
    assert process.wait(timeout=10) == 0
    assert os.getpgid(os.getpid()) != process.pid  # its own group, not the caller's
    assert log.read_text() == "before\none\ntwo\n"  # appended, stderr with stdout
    process = start(["echo", "three"], cwd=tmp_path, env=os.environ, log_path=log, fresh_log=True)
    process.wait(timeout=10)
    assert log.read_text() == "three\n"


def _settings(tmp_path):
    return SimpleNamespace(
        BASE_DIR=ROOT,
        APPLIANCE_INGEST_CONCURRENCY=1,
        APPLIANCE_PREFILL_CONCURRENCY=1,
        APPLIANCE_DECODE_CONCURRENCY=1,
    )


def test_an_unknown_process_name_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="no such appliance process: decoder"):
        start_appliance_processes({"decoder"}, settings=_settings(tmp_path), env=os.environ, log_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_appliances_processes_start_with_make_runs_command_lines_and_a_tag(tmp_path, monkeypatch):
    # A fake Popen records what would start: the command lines are the declaration's.
    started = []

    class FakePopen:
        def __init__(self, argv, **options):
            started.append((argv, options))
            self.pid = 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    from appliance.supervisor import appliance_processes

    declared = {
        s.name: s.argv for s in appliance_processes(python=sys.executable, port=0, settings=_settings(tmp_path))
    }
    start_appliance_processes(
        {"decode-worker"}, settings=_settings(tmp_path), env={"A": "1"}, log_dir=tmp_path, tag="bench"
    )
    ((argv, options),) = started
    assert argv == [a.replace("@%h", "-bench@%h") for a in declared["decode-worker"]]
    assert any("-bench@%h" in a for a in argv)  # told apart from the appliance's own worker
    assert options["env"] == {"A": "1"} and options["start_new_session"] and options["cwd"] == ROOT
    assert (tmp_path / "decode-worker.log").exists()


def test_a_held_process_group_runs_nothing_until_the_block_ends_and_then_goes_on(tmp_path):
    """``held`` (the ingest phase's windows without the ingest, and tests that claim jobs beside
    live workers) stops a process's whole group (a child too) where it is, and lets it go on
    from there after the block."""
    counter = tmp_path / "count"
    script = (
        "import pathlib, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1; p.write_text(str(n)); time.sleep(0.02)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)

    def states() -> set[str]:
        out = subprocess.run(["ps", "-o", "stat=", "-g", str(leader.pid)], capture_output=True, text=True).stdout
        return {line.strip()[0] for line in out.splitlines() if line.strip()}

    try:
        wait_until(lambda: counter.exists() and int(counter.read_text() or 0) > 5 and len(states()) == 2, timeout_s=30)
        with held([leader]):
            wait_until(lambda: states() == {"T"}, timeout_s=10)
            held_at = counter.read_text()
            time.sleep(0.5)
            assert counter.read_text() == held_at  # nothing ran while held
        wait_until(lambda: counter.read_text() != held_at, timeout_s=10)
        assert "T" not in states()
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
