"""The supervisor watches the embedded services it started: a Valkey or a Postgres killed with
``kill -9`` is started again, with its data, and the appliance's processes recover by themselves.

Real parts, on ports and data directories of this module's own: Postgres and Valkey from their
wheels, the web server and the three Celery worker pools with ``make run``'s command lines. The
engine host is a fake (``fake_engine.py``) that answers ``stats`` as ready: what is tested here is
the services, the processes that use them, and ``/healthz`` reporting them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from appliance.credentials import EmbeddedCredentials
from appliance.embedded import EmbeddedPostgres, EmbeddedValkey, free_port, port_open
from appliance.supervisor import Supervisor, appliance_processes
from tests.appliance.fake_engine import FakeEngineHost
from tests.appliance.test_supervisor import poll_until, wait_until

pytestmark = pytest.mark.integration

BASE_DIR = Path(__file__).resolve().parents[2]
QUEUES = ("ingest", "prefill", "decode")


@dataclass
class Stack:
    supervisor: Supervisor
    postgres: EmbeddedPostgres
    valkey: EmbeddedValkey
    web_port: int

    def health(self) -> tuple[int | None, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=15) as response:  # noqa: S310
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return None, {}  # the web server is not answering (yet)

    def green(self) -> bool:
        return self.health()[0] == 200

    @property
    def database_url(self) -> str:
        return self.postgres.url(superuser=True)


# The cores the supervisor keeps its services on (``appliance.cpus``): one this machine has.
SERVICE = frozenset({max(os.sched_getaffinity(0))})


@pytest.fixture(scope="module")
def stack():
    base = Path(settings.VAR_DIR) / f"supervised-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    credentials = EmbeddedCredentials.of(base)
    postgres = EmbeddedPostgres(data_dir=base / "postgres" / "data", port=free_port(), credentials=credentials)
    valkey = EmbeddedValkey(data_dir=base / "valkey", port=free_port(), credentials=credentials)
    fake_engine = FakeEngineHost().start()
    web_port = free_port()
    env = {
        "DJANGO_SETTINGS_MODULE": "appliance.settings_test",
        "HF_HUB_OFFLINE": "1",
        "APPLIANCE_VAR_DIR": str(base),
        "DATABASE_URL": postgres.url(),
        "REDIS_URL": valkey.url,
        "APPLIANCE_ENGINE_SOCKET": str(fake_engine.socket_path),
    }
    specs = [
        spec
        for spec in appliance_processes(python=sys.executable, port=web_port, settings=settings)
        if spec.name != "engine"
    ]
    for spec in specs:
        spec.env = env
    supervisor = None
    try:
        assert postgres.start() and valkey.start()
        subprocess.run(
            [sys.executable, str(BASE_DIR / "manage.py"), "migrate", "-v0"],
            cwd=BASE_DIR,
            env={**os.environ, **env},
            check=True,
            timeout=600,
        )
        supervisor = Supervisor(specs, cwd=BASE_DIR, services=[postgres, valkey], max_backoff_s=5, service_cpus=SERVICE)
        supervisor.start_all()
        stack = Stack(supervisor, postgres, valkey, web_port)
        assert poll_until(supervisor, stack.green, timeout_s=300), stack.health()
        yield stack
    finally:
        if supervisor is not None:
            supervisor.stop_all(timeout_s=30)
        valkey.stop()  # no-ops when the supervisor stopped them
        postgres.stop()
        for pid in postgres.processes():  # a failed test's leftovers (the busy backend)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        fake_engine.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_a_killed_valkey_is_started_again_with_its_data_and_the_workers_consume_again(stack, caplog):
    caplog.set_level(logging.INFO)
    client = stack.valkey.client(socket_timeout=5)
    client.set("kept-across-a-kill", "yes")
    before = stack.valkey.server_process()
    assert before is not None
    assert os.sched_getaffinity(before.pid) == SERVICE
    assert os.sched_getaffinity(stack.postgres.server_process().pid) == SERVICE

    os.kill(before.pid, signal.SIGKILL)
    assert wait_until(lambda: not port_open("127.0.0.1", stack.valkey.port), timeout_s=10)
    status, body = stack.health()  # before the supervisor has looked
    assert status == 503
    assert body["broker"]["ok"] is False and body["workers"]["ok"] is False
    assert body["database"]["ok"] is True

    assert poll_until(stack.supervisor, stack.green, timeout_s=180), stack.health()
    after = stack.valkey.server_process()
    assert after is not None and after.pid != before.pid
    assert os.sched_getaffinity(after.pid) == SERVICE  # kept there when started again
    assert client.get("kept-across-a-kill") == b"yes"  # from the append-only file
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"embedded Valkey (pid {before.pid}) is gone" in m for m in messages)
    assert any(f"embedded Valkey is back (pid {after.pid})" in m for m in messages)

    # The workers answer again (health is green) and take tasks from their queues again.
    from celery import Celery

    sender = Celery("test-sender", broker=stack.valkey.url, set_as_current=False)
    try:
        for queue in QUEUES:
            sender.send_task("celery.backend_cleanup", queue=queue)  # a built-in task that does nothing here
    finally:
        sender.close()
    assert poll_until(stack.supervisor, lambda: all(client.llen(q) == 0 for q in QUEUES), timeout_s=120), {
        q: client.llen(q) for q in QUEUES
    }


def _busy_forever(url: str, started: threading.Event) -> None:
    """A backend busy with a statement: it notices its postmaster's death only when the statement
    ends, and stays attached to the dead server's shared memory until then."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '300s'")  # ends by itself if this test is killed
        started.set()
        conn.execute("DO $$ BEGIN LOOP PERFORM 1; END LOOP; END $$")


def test_a_killed_postgres_is_started_again_cleanly_with_its_data(stack, caplog):
    caplog.set_level(logging.INFO)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept_across_a_kill (note text)")
        conn.execute("INSERT INTO kept_across_a_kill VALUES ('committed before the kill')")
    started = threading.Event()
    busy = threading.Thread(target=_busy_forever, args=(stack.database_url, started), daemon=True)
    busy.start()
    assert started.wait(timeout=30)

    def busy_backend() -> int | None:
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'DO $$%'"
            ).fetchone()
        return row[0] if row else None

    assert wait_until(lambda: busy_backend() is not None, timeout_s=30)
    backend = busy_backend()
    before = stack.postgres.server_process()
    assert before is not None

    os.kill(before.pid, signal.SIGKILL)
    assert wait_until(lambda: not port_open("127.0.0.1", stack.postgres.port), timeout_s=10)
    assert backend in stack.postgres.processes()  # outlives its postmaster: the case to clear
    status, body = stack.health()  # before the supervisor has looked
    assert status == 503
    assert body["database"]["ok"] is False and body["database"]["detail"]
    assert body["broker"]["ok"] is True

    assert poll_until(stack.supervisor, stack.green, timeout_s=180), stack.health()
    after = stack.postgres.server_process()
    assert after is not None and after.pid != before.pid
    assert backend not in stack.postgres.processes()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        assert conn.execute("SELECT note FROM kept_across_a_kill").fetchall() == [("committed before the kill",)]
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"embedded Postgres (pid {before.pid}) is gone" in m for m in messages)
    assert any("left behind" in m and str(backend) in m for m in messages)
    assert any(f"embedded Postgres is back (pid {after.pid})" in m for m in messages)
    busy.join(timeout=10)
