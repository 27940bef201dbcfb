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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from appliance.embedded import embedded_services
from appliance.supervisor import die_with_parent, appliance_processes

BASE_DIR = Path(__file__).resolve().parent.parent
ENGINE_START_TIMEOUT_S = 900  # a fresh machine compiles the model's graphs once (~2-3 min here)

_started_services = []


def pytest_sessionstart(session):
    postgres, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    for service in (postgres, valkey):
        if service.start():
            _started_services.append(service)


def pytest_sessionfinish(session, exitstatus):
    for service in reversed(_started_services):
        service.stop()


def _child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings_test", "HF_HUB_OFFLINE": "1"}
    env.update(extra)
    return env


def _stop(process: subprocess.Popen, timeout_s: float = 30) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


@pytest.fixture(scope="session")
def engine_host():
    """The real engine host, on the test socket. Yields a client of it."""
    from inference.engine.client import EngineClient, EngineUnavailable

    client = EngineClient.from_settings()
    try:
        client.stats(timeout_s=2)
        yield client  # one is running already (a developer's earlier session)
        return
    except EngineUnavailable:
        pass
    log_path = Path(settings.VAR_DIR) / "engine-host.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(BASE_DIR / "manage.py"), "engine_host"],
            cwd=BASE_DIR,
            env=_child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # no stray processes if the test run is killed
        )
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"the engine host exited with code {process.returncode}:\n{tail}")
            try:
                client.stats(timeout_s=2)
                break
            except EngineUnavailable:
                if time.monotonic() > deadline:
                    pytest.fail(f"the engine host did not become ready in {ENGINE_START_TIMEOUT_S} s; see {log_path}")
                time.sleep(1)
        yield client
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def workers(django_db_setup, django_db_blocker):
    """The ingest, prefill and decode worker pools, as `make run` starts them, on the test DB."""
    from django.db import connection

    db = connection.settings_dict
    database_url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    specs = [s for s in appliance_processes(python=sys.executable, port=0, settings=settings) if s.name.endswith("-worker")]
    log_dir = Path(settings.VAR_DIR) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for spec in specs:
        with (log_dir / f"{spec.name}.log").open("wb") as log:
            processes.append(
                subprocess.Popen(
                    spec.argv,
                    cwd=BASE_DIR,
                    env=_child_env(DATABASE_URL=database_url),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            )
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
    for process in processes:
        _stop(process)


def wait_until(predicate, *, timeout_s: float, interval_s: float = 0.25, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
