"""appliance/supervisor.py: the Supervisor with real, tiny subprocesses."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.embedded import EmbeddedServiceError, ServerProcess
from appliance.supervisor import ProcessSpec, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
EXITS_AT_ONCE = [sys.executable, "-c", "raise SystemExit(3)"]


@pytest.fixture
def supervisors():
    """Supervisors made by a test; whatever they still run is stopped afterwards."""
    made: list[Supervisor] = []

    def make(specs, **kwargs) -> Supervisor:
        supervisor = Supervisor(specs, cwd=Path.cwd(), **kwargs)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        supervisor.stopping = True
        for entry in supervisor.running.values():
            if entry.process.poll() is None:
                entry.process.kill()
            entry.process.wait(timeout=5)


def wait_until(check, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return False


def poll_until(supervisor: Supervisor, check, timeout_s: float = 5.0) -> bool:
    return wait_until(lambda: (supervisor.poll_once(), check())[1], timeout_s)


def test_start_all_starts_every_process(supervisors):
    supervisor = supervisors([ProcessSpec("one", SLEEPER), ProcessSpec("two", SLEEPER)])
    supervisor.start_all()
    assert set(supervisor.running) == {"one", "two"}
    pids = {entry.process.pid for entry in supervisor.running.values()}
    assert len(pids) == 2
    for entry in supervisor.running.values():
        assert entry.process.poll() is None
        os.kill(entry.process.pid, 0)  # really running
        # Each child leads its own process group (Ctrl-C reaches the supervisor only).
        assert os.getpgid(entry.process.pid) == entry.process.pid
    supervisor.stop_all(timeout_s=5)


def test_spec_env_and_cwd_reach_the_child(supervisors, tmp_path):
    out = tmp_path / "out.txt"
    script = "import os, pathlib; pathlib.Path(os.environ['OUT']).write_text(os.environ['APPLIANCE_TEST_MARK'] + '|' + os.getcwd())"
    supervisor = Supervisor(
        [ProcessSpec("writer", [sys.executable, "-c", script], env={"OUT": str(out), "APPLIANCE_TEST_MARK": "marked"})],
        cwd=tmp_path,
    )
    supervisor.start_all()
    try:
        assert supervisor.running["writer"].process.wait(timeout=5) == 0
        mark, cwd = out.read_text().split("|")
        assert mark == "marked"
        assert Path(cwd).resolve() == tmp_path.resolve()
    finally:
        supervisor.stop_all(timeout_s=2)


def test_a_process_that_exits_is_restarted_after_its_backoff(supervisors):
    supervisor = supervisors(
        [ProcessSpec("sleeper", SLEEPER), ProcessSpec("crasher", EXITS_AT_ONCE)], max_backoff_s=0.2
    )
    supervisor.start_all()
    sleeper = supervisor.running["sleeper"].process
    crasher = supervisor.running["crasher"]
    first = crasher.process
    assert first.wait(timeout=5) == 3

    supervisor.poll_once()  # notices the exit and schedules a restart
    assert crasher.next_start_at is not None
    assert crasher.restarts == 1
    assert crasher.process is first  # not restarted before the pause

    assert poll_until(supervisor, lambda: crasher.process is not first, timeout_s=5)
    assert crasher.process.pid != first.pid
    assert crasher.next_start_at is None
    # It keeps dying and keeps being restarted, counting the quick deaths.
    second = crasher.process
    assert poll_until(supervisor, lambda: crasher.process is not second, timeout_s=5)
    assert crasher.restarts >= 2
    # The healthy process was left alone.
    assert supervisor.running["sleeper"].process is sleeper
    assert sleeper.poll() is None
    supervisor.stop_all(timeout_s=5)


def test_restart_waits_for_the_backoff(supervisors):
    supervisor = supervisors([ProcessSpec("crasher", EXITS_AT_ONCE)], max_backoff_s=0.8)
    supervisor.start_all()
    crasher = supervisor.running["crasher"]
    first = crasher.process
    first.wait(timeout=5)
    noticed = time.monotonic()
    supervisor.poll_once()
    assert crasher.next_start_at == pytest.approx(noticed + 0.8, abs=0.2)  # min(max_backoff, 2 ** 1)
    assert poll_until(supervisor, lambda: crasher.process is not first, timeout_s=5)
    assert time.monotonic() - noticed >= 0.7
    supervisor.stop_all(timeout_s=5)


def test_stop_all_terminates_everything(supervisors):
    supervisor = supervisors([ProcessSpec("a", SLEEPER), ProcessSpec("b", SLEEPER), ProcessSpec("c", SLEEPER)])
    supervisor.start_all()
    processes = [entry.process for entry in supervisor.running.values()]
    started = time.monotonic()
    supervisor.stop_all(timeout_s=5)
    assert time.monotonic() - started < 5  # SIGTERM was enough; nobody waited for the timeout
    for process in processes:
        assert process.poll() is not None
        assert process.returncode == -signal.SIGTERM


def test_stopped_processes_are_not_restarted(supervisors):
    supervisor = supervisors([ProcessSpec("a", SLEEPER), ProcessSpec("b", SLEEPER)], max_backoff_s=0.1)
    supervisor.start_all()
    before = {name: entry.process for name, entry in supervisor.running.items()}
    supervisor.stop_all(timeout_s=5)
    deadline = time.monotonic() + 1.0  # well past any backoff
    while time.monotonic() < deadline:
        supervisor.poll_once()
        time.sleep(0.05)
    for name, entry in supervisor.running.items():
        assert entry.process is before[name]
        assert entry.process.poll() is not None
        assert entry.next_start_at is None


def test_a_pending_restart_is_dropped_by_stop_all(supervisors):
    supervisor = supervisors([ProcessSpec("crasher", EXITS_AT_ONCE)], max_backoff_s=0.2)
    supervisor.start_all()
    crasher = supervisor.running["crasher"]
    first = crasher.process
    first.wait(timeout=5)
    supervisor.poll_once()
    assert crasher.next_start_at is not None  # a restart is scheduled...
    supervisor.stop_all(timeout_s=2)
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline:
        supervisor.poll_once()
        time.sleep(0.05)
    assert crasher.process is first  # ...and never happens


def test_stop_all_kills_a_process_that_ignores_sigterm(supervisors, tmp_path):
    ready = tmp_path / "ready"
    script = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).write_text('ok')\n"
        "time.sleep(60)\n"
    )
    supervisor = supervisors([ProcessSpec("stubborn", [sys.executable, "-c", script, str(ready)])])
    supervisor.start_all()
    assert wait_until(ready.exists, timeout_s=5)
    process = supervisor.running["stubborn"].process
    started = time.monotonic()
    supervisor.stop_all(timeout_s=0.5)
    assert time.monotonic() - started < 4
    assert process.returncode == -signal.SIGKILL


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its new parent to reap it is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_stop_all_also_stops_what_a_child_left_in_its_group(supervisors, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "pathlib.Path(sys.argv[1]).write_text(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    supervisor = supervisors([ProcessSpec("parent", [sys.executable, "-c", script, str(pid_file)])])
    supervisor.start_all()
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", timeout_s=5)
    grandchild = int(pid_file.read_text())
    try:
        supervisor.stop_all(timeout_s=5)
        assert wait_until(lambda: _gone(grandchild), timeout_s=3), "the grandchild survived stop_all"
    finally:
        if not _gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


# --- Watched services ---------------------------------------------------------------------------


class FakeService:
    """A fake embedded service: its "server" is a real sleeping process, started detached like the
    real ones, so that killing it is a real death the supervisor must notice."""

    def __init__(self, name: str, events: list, *, failing_starts: int = 0) -> None:
        self.name = name
        self.events = events
        self.failing_starts = failing_starts
        self.servers: list[subprocess.Popen] = []
        self.start()

    def start(self) -> bool:
        self.events.append(("start", self.name))
        if self.failing_starts:
            self.failing_starts -= 1
            raise EmbeddedServiceError(f"{self.name} cannot start (as told)")
        self.servers.append(subprocess.Popen(SLEEPER, start_new_session=True))
        return True

    def stop(self) -> None:
        self.events.append(("stop", self.name))
        server = self.servers[-1]
        server.terminate()
        server.wait(timeout=5)

    def server_process(self) -> ServerProcess | None:
        return ServerProcess.of(self.servers[-1].pid) if self.servers else None

    def kill(self) -> None:
        """SIGKILL the server, not reaped: the zombie left must count as dead."""
        server = self.servers[-1]
        server.kill()
        assert wait_until(lambda: Path(f"/proc/{server.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z")

    def cleanup(self) -> None:
        for server in self.servers:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=5)


@pytest.fixture
def fake_services():
    made: list[FakeService] = []

    def make(name, events, **kwargs) -> FakeService:
        made.append(FakeService(name, events, **kwargs))
        return made[-1]

    yield make
    for service in made:
        service.cleanup()


def test_a_watched_service_whose_server_dies_is_started_again(supervisors, fake_services, caplog):
    events: list = []
    broker = fake_services("fake broker", events)
    supervisor = supervisors([], services=[broker], max_backoff_s=0.2)
    first = broker.servers[-1]
    supervisor.poll_once()
    assert len(broker.servers) == 1  # alive: left alone

    caplog.set_level(logging.INFO, logger="appliance.supervisor")
    broker.kill()
    assert poll_until(supervisor, lambda: len(broker.servers) == 2, timeout_s=5)
    assert broker.servers[-1].pid != first.pid and broker.servers[-1].poll() is None
    assert supervisor.services[0].restarts == 1  # it died within a minute of being watched
    assert supervisor.services[0].server.pid == broker.servers[-1].pid  # the new server is the one watched
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"fake broker (pid {first.pid}) is gone" in m and "starting it again" in m for m in messages)
    assert any(f"fake broker is back (pid {broker.servers[-1].pid})" in m for m in messages)
    # The new server is watched in turn.
    broker.kill()
    assert poll_until(supervisor, lambda: len(broker.servers) == 3, timeout_s=5)
    assert supervisor.services[0].restarts == 2
    supervisor.stop_all(timeout_s=5)


def test_a_service_that_fails_to_start_is_tried_again_each_time_later(supervisors, fake_services, caplog):
    events: list = []
    database = fake_services("fake database", events)
    supervisor = supervisors([], services=[database], max_backoff_s=0.2)
    database.failing_starts = 2
    database.kill()
    caplog.set_level(logging.ERROR, logger="appliance.supervisor")
    assert poll_until(supervisor, lambda: supervisor.services[0].up, timeout_s=10)
    assert events.count(("start", "fake database")) == 4  # the first, two that failed, the one that worked
    # Each failed start counts as one more quick death: the pause grows (up to max_backoff_s).
    assert supervisor.services[0].restarts == 3
    failures = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert len(failures) == 2 and "cannot start (as told)" in failures[0]
    supervisor.stop_all(timeout_s=5)


def test_stop_all_stops_the_processes_newest_first_then_the_services_newest_first(supervisors, fake_services, caplog):
    events: list = []
    database = fake_services("fake database", events)
    broker = fake_services("fake broker", events)
    supervisor = supervisors([ProcessSpec("a", SLEEPER), ProcessSpec("b", SLEEPER)], services=[database, broker])
    supervisor.start_all()
    processes = [entry.process for entry in supervisor.running.values()]
    exited_when_services_stopped = []
    original_stop = FakeService.stop

    def stop_after_checking(self):
        exited_when_services_stopped.append(all(p.poll() is not None for p in processes))
        original_stop(self)

    caplog.set_level(logging.INFO, logger="appliance.supervisor")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FakeService, "stop", stop_after_checking)
        supervisor.stop_all(timeout_s=5)
    stopping = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping ")]
    assert stopping == ["stopping b", "stopping a", "stopping fake broker", "stopping fake database"]
    assert [e for e in events if e[0] == "stop"] == [("stop", "fake broker"), ("stop", "fake database")]
    assert exited_when_services_stopped == [True, True]  # the services outlive every process
    for server in (database.servers[-1], broker.servers[-1]):
        assert server.poll() is not None


def test_a_service_is_not_started_again_once_stopping(supervisors, fake_services):
    events: list = []
    broker = fake_services("fake broker", events)
    supervisor = supervisors([], services=[broker], max_backoff_s=0.1)
    supervisor.stop_all(timeout_s=5)
    assert events == [("start", "fake broker"), ("stop", "fake broker")]
    deadline = time.monotonic() + 0.5  # well past the pause
    while time.monotonic() < deadline:
        supervisor.poll_once()
        time.sleep(0.05)
    assert events == [("start", "fake broker"), ("stop", "fake broker")]


def test_a_dead_service_is_not_stopped(supervisors, fake_services):
    events: list = []
    broker = fake_services("fake broker", events)
    supervisor = supervisors([], services=[broker], max_backoff_s=5)
    broker.kill()
    supervisor.poll_once()  # noticed; a restart is due later
    supervisor.stop_all(timeout_s=5)
    assert ("stop", "fake broker") not in events
