"""What a web unit, service or container runs, run for real: ``manage.py process web`` against a
database of its own prepares it (migrates, collects static files, makes the administrator), then
*becomes* the web server (the same pid, so the manager's SIGTERM reaches uvicorn), which answers
and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psycopg
import pytest
from django.conf import settings

from appliance.embedded import free_port
from tests.conftest import BASE_DIR, _database_url
from tests.deploy.manifests import ROOT

pytestmark = pytest.mark.integration


def answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.fixture
def own_database():
    """A database of its own on the test server (dropped afterwards), so that the migration and
    the administrator the web role makes touch nothing of the session's test database."""
    name = f"appliance_deploy_{os.getpid()}"
    with psycopg.connect(_database_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(name)
    finally:
        with psycopg.connect(_database_url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_process_web_prepares_then_becomes_the_web_server(own_database, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "appliance.settings_test",
        "HF_HUB_OFFLINE": "1",
        "DATABASE_URL": own_database,
        "REDIS_URL": settings.REDIS_URL,
        "APPLIANCE_VAR_DIR": str(tmp_path / "var"),
        "APPLIANCE_PORT": str(port),
        "APPLIANCE_ADMIN_PASSWORD": "a-long-unusual-passphrase-42",
    }
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(BASE_DIR / "manage.py"), "process", "web"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # migrating a new database on a busy 2-core machine
        while answers(f"http://127.0.0.1:{port}/healthz") is None:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        # The unit's own process is now uvicorn: exec, not a child under a supervisor.
        cmdline = (f"/proc/{process.pid}/cmdline").encode()
        argv = open(cmdline, "rb").read().split(b"\0")  # noqa: PTH123, SIM115
        assert b"uvicorn" in argv and b"appliance.asgi:application" in argv, argv
        text = log.read_text()
        assert "starting web:" in text
        with psycopg.connect(own_database) as conn:  # the web role migrated and made the administrator
            (admins,) = conn.execute("SELECT count(*) FROM auth_user WHERE is_superuser").fetchone()
            assert admins == 1
        assert (tmp_path / "var" / "static").is_dir()  # collected
        process.send_signal(signal.SIGTERM)
        # uvicorn's own graceful stop, after which it ends by the signal it caught (systemd counts
        # that as a clean stop: SuccessExitStatus takes SIGTERM by default).
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Finished server process" in log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_announce_node_reports_this_node_until_sigterm(tmp_path):
    """The heartbeat unit and containers (``appliance-node``, ``node-web``, ``node-gpu``, a pod's
    ``node``): this node's name and roles in the broker, again and again, then a clean stop."""
    from appliance.cluster import NODES_KEY, forget, nodes
    from inference.streaming import sync_client

    name = f"deploy-test-{os.getpid()}"
    client = sync_client()
    forget(name, client)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "appliance.settings_test",
        "DATABASE_URL": _database_url("postgres"),  # a node on its own names the web node's services
        "REDIS_URL": settings.REDIS_URL,
        "APPLIANCE_ROLES": "web,ingest",
        "APPLIANCE_NODE_NAME": name,
        "APPLIANCE_NODE_HEARTBEAT_S": "0.5",
    }
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(BASE_DIR / "manage.py"), "announce_node"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        seen: list[float] = []
        while len(seen) < 2:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            node = next((n for n in nodes(client) if n["name"] == name), None)
            if node and (not seen or node["announced_at"] > seen[-1]):
                seen.append(node["announced_at"])
            time.sleep(0.2)
        assert node["up"] and node["roles"] == ["ingest", "web"] and node["engine_url"] == ""
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        client.hdel(NODES_KEY, name)
