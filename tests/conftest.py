"""Fixtures: the real parts, started once per test session.

- Embedded Postgres (with pgvector) and Valkey on the test ports (``appliance.settings_test``),
  started at session start if they are not running, stopped at the end if this session started
  them.
- ``engine_host``: the real engine host process with the real small model (vLLM CPU build).
- ``workers``: the real Celery worker pools, started with the same command lines ``make run``
  uses, pointed at the test database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from appliance.embedded import embedded_services
from appliance.processes import held, start_appliance_processes, stop_groups

BASE_DIR = Path(__file__).resolve().parent.parent
ENGINE_START_TIMEOUT_S = 900  # a fresh machine compiles the model's graphs once (~2-3 min here)

_started_services = []


def _sessions_dir() -> Path:
    """One file per running test session: the services stop with the last session, not the first
    to finish (two sessions share them, each with its own database: APPLIANCE_TEST_DB_NAME)."""
    path = Path(settings.VAR_DIR) / "sessions"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _other_sessions_alive() -> bool:
    alive = False
    for entry in _sessions_dir().iterdir():
        pid = int(entry.name) if entry.name.isdigit() else 0
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            alive = True
        except (ProcessLookupError, ValueError):
            entry.unlink(missing_ok=True)
        except PermissionError:
            alive = True
    return alive


def pytest_sessionstart(session):
    (_sessions_dir() / str(os.getpid())).touch()
    postgres, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    for service in (postgres, valkey):
        if service.start():
            _started_services.append(service)


def pytest_collection_finish(session):
    test_types = sys.modules.get("tests.test_types")  # collected, and so imported, or not asked for
    if test_types is None or session.config.option.collectonly:
        return
    if any(item.nodeid == test_types.WHOLE_TREE_TEST for item in session.items):
        test_types.start_early()  # mypy at the lowest CPU priority, beside the tests before it


def pytest_sessionfinish(session, exitstatus):
    if test_types := sys.modules.get("tests.test_types"):
        test_types.stop_early()
    (_sessions_dir() / str(os.getpid())).unlink(missing_ok=True)
    if _other_sessions_alive():
        return
    for service in reversed(_started_services):
        service.stop()


def _child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings_test", "HF_HUB_OFFLINE": "1"}
    env.update(extra)
    return env


def _stop(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """Stop ``process`` and whatever it left in its group, at once (the tests' processes)."""
    stop_groups([process], timeout_s=timeout_s, grace_s=0)


def _engine_tcp() -> dict[str, str]:
    """Where the test engine host listens on TCP, with its TLS files: made once per test var
    directory and kept there, so that a host an earlier session started is found again."""
    import json
    import socket

    from tests.tls import make_certificates

    path = Path(settings.VAR_DIR) / "run" / "engine-tcp.json"
    if path.exists():
        return json.loads(path.read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    certificates = make_certificates(Path(settings.VAR_DIR) / "tls", name="engine")
    tcp = {"listen": f"127.0.0.1:{port}", "url": f"tls://127.0.0.1:{port}", "ca": str(certificates.ca),
           "cert": str(certificates.cert), "key": str(certificates.key)}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tcp))
    return tcp


class EngineHosts:
    """Starts the real engine host on the test socket when none answers there, and can kill it
    (with vLLM's engine core) and start it again, as `make run`'s supervisor would."""

    def __init__(self) -> None:
        from inference.engine.client import EngineClient

        self.client = EngineClient.from_settings()
        self.process: subprocess.Popen | None = None
        self.log_path = Path(settings.VAR_DIR) / "logs" / "engine.log"
        self.tcp = _engine_tcp()

    def tls_client(self, **kwargs):
        """A client of the same engine host over TLS on loopback, as another node's workers reach it."""
        from inference.engine.client import EngineClient

        return EngineClient(self.tcp["url"], tls_ca=self.tcp["ca"], **kwargs)

    def answers(self) -> bool:
        from inference.engine.client import EngineUnavailable

        try:
            self.client.stats(timeout_s=2)
        except EngineUnavailable:
            return False
        return True

    def ensure_running(self) -> None:
        if self.answers():
            return  # one is running already (a developer's earlier session, or started here)
        # The declared engine host (as `make run` starts it); the suite's tests switch the
        # scheduling policy as the benchmarks do. Tied to this session: no stray engine if it is killed.
        (self.process,) = start_appliance_processes(
            {"engine"},
            settings=settings,
            env=_child_env(
                APPLIANCE_ENGINE_BENCHMARK_OPS="1",
                # Also over TLS on loopback, as other nodes' workers reach an engine.
                APPLIANCE_ENGINE_LISTEN=self.tcp["listen"],
                APPLIANCE_ENGINE_TLS_CERT=self.tcp["cert"],
                APPLIANCE_ENGINE_TLS_KEY=self.tcp["key"],
            ),
            log_dir=self.log_path.parent,
            tie_to_parent=True,
        )
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while not self.answers():
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"the engine host exited with code {self.process.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                pytest.fail(f"the engine host did not become ready in {ENGINE_START_TIMEOUT_S} s; see {self.log_path}")
            time.sleep(1)

    def kill(self) -> None:
        """SIGKILL the engine host and everything it started: a crash, not a shutdown."""
        from appliance.processes import kill_tree

        kill_tree(int(self.client.stats()["pid"]))
        if self.process is not None:
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)


@pytest.fixture(scope="session")
def engine_hosts():
    hosts = EngineHosts()
    try:
        yield hosts
    finally:
        hosts.stop()


@pytest.fixture(scope="session")
def engine_host(engine_hosts):
    """The real engine host, on the test socket. Yields a client of it."""
    engine_hosts.ensure_running()
    return engine_hosts.client


def _test_database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    return _database_url(db["NAME"])


def _database_url(name: str) -> str:
    """The test database's server, as the appliance's role (with its password) on ``name``."""
    from urllib.parse import quote

    from django.db import connection

    db = connection.settings_dict
    return f"postgresql://{quote(db['USER'])}:{quote(db['PASSWORD'], safe='')}@{db['HOST']}:{db['PORT']}/{name}"


def _wait_for_other_sessions_to_close(timeout_s: float = 15) -> None:
    """A killed process's Postgres backend exits a moment later; the test database can only be
    dropped at the end of the run once it has."""
    import psycopg
    from django.db import connection

    from appliance.database import close_pool

    if not connection.in_atomic_block:
        close_pool()  # this process's own idle pooled connections are not what is waited for
    db = connection.settings_dict
    own = [connection.connection.info.backend_pid] if connection.connection is not None else []
    admin_url = _database_url("postgres")
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            (others,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)",
                (db["NAME"], own),
            ).fetchone()
            if others == 0:
                return
            time.sleep(0.2)
        # Still there: a session of a process this run started and has stopped (nothing else uses
        # the test database). End it, so that the test database can be dropped.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)",
            (db["NAME"], own),
        )


def _start_appliance_processes(names: set[str], *, port: int = 0) -> list[subprocess.Popen]:
    """Processes of `make run` (same command lines), pointed at the test database."""
    return start_appliance_processes(
        names,
        settings=settings,
        env=_child_env(DATABASE_URL=_test_database_url()),
        log_dir=Path(settings.VAR_DIR) / "logs",
        port=port,
        fresh_log=True,
        tie_to_parent=True,
    )


_LIVE_WORKERS: list[subprocess.Popen] = []  # the session's worker pools, while `workers` has them running


@pytest.fixture(scope="session")
def workers(django_db_setup, django_db_blocker):
    """The ingest, prefill and decode worker pools, as `make run` starts them, on the test DB."""
    processes = _start_appliance_processes({"ingest-worker", "prefill-worker", "decode-worker"})
    _LIVE_WORKERS.extend(processes)
    log_dir = Path(settings.VAR_DIR) / "logs"
    from appliance.celery import app

    deadline = time.monotonic() + 60
    wanted = {"ingest", "prefill", "decode"}
    while True:
        replies = app.control.inspect(timeout=1.0).active_queues() or {}
        served = {q["name"] for queues in replies.values() for q in queues}
        if wanted <= served:
            break
        if time.monotonic() > deadline:
            for p in processes:
                _stop(p)
            pytest.fail(f"workers did not start; queues served: {sorted(served)}; logs in {log_dir}")
        time.sleep(0.5)
    yield processes
    _LIVE_WORKERS.clear()
    for process in processes:
        _stop(process)
    _wait_for_other_sessions_to_close()


@pytest.fixture
def workers_held():
    """The session's worker pools, if an earlier test started them, held still (SIGSTOP to each
    process group) for the test and continued after it. A test that claims jobs in its own process
    needs this: a turn an earlier test left behind (an engine retry's countdown) would otherwise
    reach a live worker mid-test, and that worker would claim the test's rows by fair share."""
    with held([p for p in _LIVE_WORKERS if p.poll() is None]):
        yield


@pytest.fixture(scope="session")
def live_appliance(django_db_setup):
    """The real ASGI web server (uvicorn, as `make run` starts it) on a free port. Yields its URL."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (process,) = _start_appliance_processes({"web"}, port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_web_server(url)
        yield url
    finally:
        _stop(process)
        if not any(p.poll() is None for p in _LIVE_WORKERS):
            # With the session's workers still running, their connections would hold this wait
            # to its end; the workers' own teardown waits for every session, the web's too.
            _wait_for_other_sessions_to_close()


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user(username="alice", password="a long password indeed")


@pytest.fixture
def browser(alice):
    """A browser session signed in as alice (Django's test client)."""
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


def wait_for_web_server(url: str, *, timeout_s: float = 60) -> None:
    import urllib.request

    def answers() -> bool:
        try:
            urllib.request.urlopen(url + "/accounts/login/", timeout=2)
            return True
        except OSError:
            return False

    wait_until(answers, timeout_s=timeout_s, message="the web server")


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    """For the tests of what is queued (an upload, a batch, a poll, an e-mail's attachments),
    without the worker: the documents queued for ingestion are listed here, not sent. Such a
    test's transaction commits, and an ingest worker left running by another test of the session
    would still be reading them while the test database is emptied (a race ``test_batches_api``
    met, and a teardown deadlock ``test_limits`` met). Ingestion is tested with the real worker."""
    from documents import services

    ids: list[int] = []
    monkeypatch.setattr(services, "_dispatch_upload", lambda document: ids.append(document.pk))
    monkeypatch.setattr(services, "_enqueue_ingest", ids.append)
    return ids


def read(document, timeout_s: float = 300):
    """The document once the ingest worker has finished with it (read, failed or cancelled)."""

    def finished():
        document.refresh_from_db()
        return document if document.is_finished else None

    return wait_until(finished, timeout_s=timeout_s, message=f"{document.filename} to be read")


def all_read(timeout_s: float = 300) -> None:
    """Wait for the ingest worker to finish every document, so that none is being read while the
    test database is emptied after the test."""
    from documents.models import UNFINISHED_STATES, Document

    wait_until(
        lambda: not Document.objects.filter(state__in=UNFINISHED_STATES).exists(),
        timeout_s=timeout_s,
        message="every document to be read",
    )


def wait_until(predicate, *, timeout_s: float, interval_s: float = 0.25, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
