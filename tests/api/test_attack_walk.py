"""The attack walk: the probes of the security review, run as an attacker would against the live
test appliance (uvicorn as `make run` starts it, the suite's Postgres, Valkey and engine host),
as ``test_acl_walk`` does for reads. Each probe names what it tries; every one must be refused.

Probes that need another vantage point live beside the code they probe and are named here so
that the walk is the index: role markers in documents (``tests/inference/test_chat_tokens.py``),
withdrawn sharing (``tests/inference/test_job_pages.py``, ``tests/documents/test_acl.py``),
``/metrics`` from another address (``tests/appliance/test_metrics.py``), the benchmark operations
on a host not started for a benchmark (``tests/inference/test_engine_auth.py``), TLS settings
and ``check --deploy`` (``tests/appliance/test_deploy_check.py``), password rules
(``tests/appliance/test_passwords.py``), each per-person limit (``tests/api/test_limits.py``).
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from django.conf import settings

from api.services import token_create
from appliance.embedded import embedded_services
from documents.sandbox import extract_in_sandbox, last_confinement
from inference.models import Job, JobKind, Queue
from tests.api.test_api_live import _raw_post

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def broker():
    _, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    return valkey.client(socket_timeout=10)


def _refused(name: str, failures: list[str], check) -> None:
    try:
        check()
    except AssertionError as exc:
        failures.append(f"{name}: {exc}")


def test_the_attack_walk(live_appliance, engine_host, django_user_model, broker):  # noqa: C901 - a list of probes
    failures: list[str] = []
    postgres, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    victim = django_user_model.objects.create_user(username=f"victim-{uuid.uuid4().hex[:8]}", password="x" * 24)
    _, victim_token = token_create(user=victim, name="victim's tool", scopes=["read", "write"])
    web = httpx.Client(base_url=live_appliance, timeout=30)

    def database_without_password():
        for user in ("postgres", "appliance"):
            try:
                psycopg.connect(host="127.0.0.1", port=postgres.port, user=user, dbname="postgres", connect_timeout=10)
            except psycopg.OperationalError as exc:
                assert "password" in str(exc)
            else:
                raise AssertionError(f"connected as {user} without a password")

    def broker_without_password():
        stranger = redis.Redis(host="127.0.0.1", port=valkey.port, socket_timeout=5)
        try:  # a forged `done` event for someone's job, or a task pushed onto a queue
            stranger.xadd("job:00000000-0000-0000-0000-000000000000:events", {"event": "done", "data": "{}"})
        except redis.AuthenticationError:
            return
        raise AssertionError("wrote to the broker without its password")

    def engine_without_token():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(engine_host.socket_path))
            sock.sendall(b'{"op": "run_direct", "requests": []}\n')
            answer = json.loads(sock.makefile("rb").readline())
        assert answer.get("code") == "unauthorized", answer
        assert Path(engine_host.socket_path).stat().st_mode & 0o077 == 0, "the engine socket is open to others"

    def parsing_child_is_confined():
        extract_in_sandbox(b"a note", filename="note.txt")
        confinement = last_confinement() or {}
        assert confinement.get("landlock_abi", 0) >= 1, confinement
        assert confinement.get("network_namespace") or confinement.get("landlock_network"), confinement

    def body_before_authentication():
        login = (
            "POST /accounts/login/ HTTP/1.1\r\nHost: appliance\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        )
        status = _raw_post(live_appliance, login + "Content-Length: 900000000\r\n\r\n", [])
        assert " 413 " in status, status

    def guessing_a_password():
        name = f"target-{uuid.uuid4().hex[:8]}"
        django_user_model.objects.create_user(username=name, password="the right password, long")
        statuses = []
        for _ in range(settings.APPLIANCE_LOGIN_FAILURES_PER_USER + 1):
            page = web.get("/accounts/login/")
            token = page.cookies.get("csrftoken")
            response = web.post(
                "/accounts/login/",
                data={"username": name, "password": "a guess", "csrfmiddlewaretoken": token},
                headers={"Referer": f"{live_appliance}/accounts/login/"},
                cookies={"csrftoken": token},
            )
            statuses.append(response.status_code)
        assert statuses[-1] == 429, statuses
        for key in broker.scan_iter("appliance:signin:*"):  # leave no lockout for the tests after
            broker.delete(key)

    def anonymous_health():
        # From the network, through the TLS proxy on this box (which adds X-Forwarded-For): the
        # request arrives from loopback, and must not count as the box itself.
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            body = httpx.get(f"{live_appliance}/healthz", headers={header: "203.0.113.9"}, timeout=30).json()
            assert set(body) == {"status"}, (header, body)
        metrics = httpx.get(f"{live_appliance}/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=30)
        assert metrics.status_code in (401, 403, 404), metrics.status_code

    def versions_for_a_read_token():
        body = web.get("/api/v1/engine", headers={"Authorization": f"Bearer {victim_token}"}).json()
        assert body.get("vllm_version") is None and body.get("torch_version") is None, body

    def scripts_from_elsewhere():
        policy = web.get("/accounts/login/").headers.get("Content-Security-Policy", "")
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src", 1)[1].split(";")[0]

    def streams_without_end():
        job = Job.objects.create(owner=victim, kind=JobKind.CHAT, queue=Queue.DECODE)
        headers = {"Authorization": f"Bearer {victim_token}"}
        limit = settings.APPLIANCE_MAX_STREAMS_PER_USER
        opened = []
        try:
            for _ in range(limit):
                stream = web.stream("GET", f"/api/v1/jobs/{job.pk}/stream", headers=headers)
                response = stream.__enter__()
                opened.append(stream)
                assert response.status_code == 200
            extra = web.get(f"/api/v1/jobs/{job.pk}/stream", headers=headers)
            assert extra.status_code == 429 and "APPLIANCE_MAX_STREAMS_PER_USER" in extra.text, extra.status_code
        finally:
            for stream in opened:
                stream.__exit__(None, None, None)
            broker.delete(f"appliance:streams:{victim.pk}")

    probes = {
        "the database, as any local process": database_without_password,
        "the broker, as any local process": broker_without_password,
        "the engine socket, as any local process": engine_without_token,
        "out of the parsing child": parsing_child_is_confined,
        "a large body before signing in": body_before_authentication,
        "guessing a password": guessing_a_password,
        "health details without signing in": anonymous_health,
        "software versions with a read token": versions_for_a_read_token,
        "scripts from elsewhere": scripts_from_elsewhere,
        "streams without end": streams_without_end,
    }
    for name, probe in probes.items():
        _refused(name, failures, probe)
    web.close()
    assert not failures, "\n".join(failures)
