"""A job's life through the real queues, workers, broker and engine host: a frozen worker whose job
was handed on never writes it again, users take turns on a queue, the time limit holds on the
threads pool, and a web process whose broker is down answers 503 without leaving a queued job,
and 429 for a person over their share of the queue."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.utils import timezone

from api.services import token_create
from appliance.processes import start
from appliance.supervisor import appliance_processes
from inference import services, streaming
from inference.models import Job, JobKind, Queue
from tests.conftest import BASE_DIR, _child_env, _stop, _test_database_url, wait_for_web_server, wait_until
from tests.factories import ready_document

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LETTER = [{"role": "user", "content": "Write a reply to a supplier who asks when the invoice will be paid."}]


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="another long password")


def _finished(job_id):
    job = Job.objects.get(pk=job_id)
    return job if job.is_finished else None


def _entries(job_id) -> list[tuple[str, dict]]:
    return [
        (fields[b"event"].decode(), json.loads(fields[b"data"]))
        for _, fields in streaming.sync_client().xrange(streaming.stream_key(job_id))
    ]


def _serving() -> dict[str, list[str]]:
    from appliance.celery import app

    replies = app.control.inspect(timeout=1.0).active_queues() or {}
    return {name: [q["name"] for q in queues] for name, queues in replies.items()}


@contextmanager
def solo_worker(queue: str, name: str, *, concurrency: int = 1, **env: str):
    """A worker of its own for ``queue``, started as `make run` starts one (threads pool), the
    only one consuming it while it lives; the session's workers consume it again afterwards."""
    from appliance.celery import app

    session = [n for n, queues in _serving().items() if queue in queues]
    app.control.cancel_consumer(queue, destination=session, reply=True)
    log_path = settings.VAR_DIR / "logs" / f"{name}-worker.log"
    process = start(
        [sys.executable, "-m", "celery", "-A", "appliance", "worker", "-Q", queue, "-n", f"{queue}@{name}.%h",
         "--pool", "threads", "-c", str(concurrency), "--without-gossip", "--without-mingle"],
        cwd=BASE_DIR, env=_child_env(DATABASE_URL=_test_database_url(), **env), log_path=log_path, fresh_log=True,
    )  # fmt: skip
    hostname = wait_until(
        lambda: next((n for n in _serving() if n.startswith(f"{queue}@{name}.")), None),
        timeout_s=60,
        message=f"the {name} worker",
    )
    try:
        yield SimpleNamespace(process=process, session=session, hostname=hostname, log_path=log_path)
    finally:
        _stop(process)
        app.control.add_consumer(queue, destination=session, reply=True)


def test_a_frozen_worker_whose_job_was_handed_on_never_writes_it_again(alice, workers, engine_host):
    from appliance.celery import app

    with solo_worker("decode", "frozen") as frozen:
        job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=150, ignore_eos=True)
        wait_until(lambda: "delta" in [e for e, _ in _entries(job.pk)], timeout_s=300, message="the first attempt")
        # It takes no other message, then stops: alive, but its heartbeats stop.
        app.control.cancel_consumer("decode", destination=[frozen.hostname], reply=True)
        os.killpg(frozen.process.pid, signal.SIGSTOP)
        try:
            app.control.add_consumer("decode", destination=frozen.session, reply=True)
            job = wait_until(lambda: _finished(job.pk), timeout_s=600, message="the second attempt to finish it")
            assert job.state == Job.State.SUCCEEDED, job.error
            assert job.attempts == 2
            seen = _entries(job.pk)
            os.killpg(frozen.process.pid, signal.SIGCONT)
            # The first attempt wakes, finds its claim gone at its first write, and stops.
            wait_until(
                lambda: "having lost its claim" in frozen.log_path.read_text(errors="replace"),
                timeout_s=120,
                message="the first attempt to notice it lost its claim",
            )
        finally:
            os.killpg(frozen.process.pid, signal.SIGCONT)
    assert _entries(job.pk) == seen  # not one event of the first attempt after it woke
    job.refresh_from_db()
    assert job.state == Job.State.SUCCEEDED and job.attempts == 2
    names = [event for event, _ in seen]
    last_restart = len(names) - 1 - names[::-1].index("restart")
    assert names[-1] == "done" and names.count("done") == 1
    after = "".join(data["text"] for event, data in seen[last_restart:] if event == "delta")
    assert after.strip() == job.result_text  # the stored result is the second attempt's
    assert job.metrics.output_tokens == 150


def test_one_users_batch_does_not_hold_back_another_users_single_job(alice, bob, workers, engine_host):
    with solo_worker("decode", "fair"):  # one job at a time, so that the order is the queue's
        batch = [
            services.job_create_chat(owner=alice, messages=LETTER, max_tokens=64, ignore_eos=True) for _ in range(5)
        ]
        single = services.job_create_chat(owner=bob, messages=LETTER, max_tokens=64, ignore_eos=True)
        for job in [*batch, single]:
            wait_until(lambda job=job: _finished(job.pk), timeout_s=600, message="the jobs")
    single.refresh_from_db()
    batch = list(Job.objects.filter(pk__in=[j.pk for j in batch]))
    assert single.state == Job.State.SUCCEEDED and all(j.state == Job.State.SUCCEEDED for j in batch)
    between = [j for j in batch if single.created_at < j.started_at < single.started_at]
    assert len(between) <= 1, f"{len(between)} of alice's jobs started while bob's waited"
    assert sum(j.started_at > single.started_at for j in batch) >= 3  # they were queued ahead of it


def test_the_time_limit_holds_on_the_threads_pool_and_aborts_the_engine_request(alice, workers, engine_host):
    with solo_worker("decode", "limited", APPLIANCE_JOB_TIME_LIMIT_S="10"):
        served_before = engine_host.stats()["requests_served"]
        job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=4000, ignore_eos=True)
        job = wait_until(lambda: _finished(job.pk), timeout_s=300, message="the job to be stopped")
        assert job.state == Job.State.FAILED
        assert "took longer than the 10 seconds the appliance allows one job" in job.error
        wait_until(lambda: engine_host.stats()["admitted_requests"] == 0, timeout_s=60, message="the engine to let go")
        assert engine_host.stats()["requests_served"] == served_before  # aborted, not run to its end
        assert [e for e, _ in _entries(job.pk)][-1] == "failed"


@pytest.fixture
def web_with_dead_broker(django_db_setup):
    """The real web server (uvicorn, as `make run` starts it) whose broker is a port where nothing
    listens, with a per-person limit of 2 queued jobs. Yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # bound and closed: nothing listens there now
    (spec,) = [s for s in appliance_processes(python=sys.executable, port=port, settings=settings) if s.name == "web"]
    log_path = settings.VAR_DIR / "logs" / "web-dead-broker.log"
    env = _child_env(
        DATABASE_URL=_test_database_url(), REDIS_URL=f"redis://127.0.0.1:{dead}/0", APPLIANCE_MAX_QUEUED_PER_USER="2"
    )
    process = start(spec.argv, cwd=BASE_DIR, env=env, log_path=log_path, fresh_log=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_web_server(url)
        yield url
    finally:
        _stop(process)


def _post(url: str, token: str, body: dict):
    """(status, headers (case-insensitive), JSON body) of a POST."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read())


def test_with_the_broker_down_creating_a_job_is_503_and_leaves_nothing_queued(alice, web_with_dead_broker):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month, paid on the first day.")
    _, token = token_create(user=alice, name="tool", scopes=["read", "write"])
    status, headers, body = _post(f"{web_with_dead_broker}/api/v1/jobs/summary", token, {"document_id": document.pk})
    assert status == 503 and int(headers["Retry-After"]) > 0, body
    assert body["type"] == "/api/problems/unavailable" and "broker" in body["detail"]
    chat = {"model": settings.APPLIANCE_MODEL.name, "messages": LETTER}
    status, headers, body = _post(f"{web_with_dead_broker}/v1/chat/completions", token, chat)
    assert status == 503 and int(headers["Retry-After"]) > 0 and body["error"]["code"] == "unavailable"
    assert not Job.objects.exists()  # not queued, not anything


def test_a_person_over_their_share_of_the_queue_gets_429_naming_the_limit(alice, web_with_dead_broker):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month, paid on the first day.")
    for _ in range(2):
        Job.objects.create(  # sent already, as far as any watchdog knows
            owner=alice, document=document, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, dispatched_at=timezone.now()
        )
    _, token = token_create(user=alice, name="tool", scopes=["read", "write"])
    status, headers, body = _post(f"{web_with_dead_broker}/api/v1/jobs/summary", token, {"document_id": document.pk})
    assert status == 429 and int(headers["Retry-After"]) >= 5, body
    assert body["type"] == "/api/problems/queue-full"
    assert "the most one person may have waiting at once (2)" in body["detail"]
    assert Job.objects.count() == 2
