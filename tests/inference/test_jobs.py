"""Jobs through the real queues, workers and engine host: chat on the decode queue, a worker killed
mid-job, and an engine host that crashes and comes back."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from appliance.processes import start
from documents.embeddings import EMBEDDER_WARM_LOG
from inference import services, streaming
from inference.models import Job, Queue
from tests.conftest import BASE_DIR, _child_env, _stop, _test_database_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LETTER = [{"role": "user", "content": "Write a reply to a supplier who asks when the invoice will be paid."}]


def _finished(job_id):
    job = Job.objects.get(pk=job_id)
    return job if job.is_finished else None


def _events(job_id) -> list[str]:
    return [fields[b"event"].decode() for _, fields in streaming.sync_client().xrange(streaming.stream_key(job_id))]


def test_a_chat_job_runs_on_the_decode_queue_with_drafting_priority(alice, workers, engine_host):
    job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=20, ignore_eos=True)
    job = wait_until(lambda: _finished(job.pk), timeout_s=300, message="the chat job")
    assert job.state == Job.State.SUCCEEDED, job.error
    assert job.result_text
    metrics = job.metrics
    assert metrics.queue == Queue.DECODE
    assert metrics.scheduling == "appliance"
    assert metrics.output_tokens == 20  # ignore_eos: exactly max_tokens
    assert metrics.prefill_ms is not None and metrics.prefill_ms > 0
    assert metrics.ttft_ms >= metrics.queue_wait_ms
    assert not metrics.preempted
    assert _events(job.pk).count("delta") >= 2


@pytest.fixture
def victim_decode_worker(workers):
    """A decode worker of its own, the only one consuming the decode queue while it lives; the
    session's decode worker consumes again afterwards. Yielded once it has loaded its embedder:
    the load (importing torch, then the model) holds the interpreter for seconds at a time, and
    beside the suite's 8 s heartbeat timeout a job started meanwhile could be handed on before
    any kill (a third attempt, seen once on a 2-core machine); the test is about the kill."""
    from appliance.celery import app

    session_decode = [
        name
        for name, queues in (app.control.inspect(timeout=1.0).active_queues() or {}).items()
        if name.startswith("decode@")
    ]
    app.control.cancel_consumer("decode", destination=session_decode, reply=True)
    log = settings.VAR_DIR / "logs" / "victim-worker.log"
    process = start(
        [sys.executable, "-m", "celery", "-A", "appliance", "worker", "-Q", "decode", "-n", "decode@victim.%h",
         "--pool", "threads", "-c", "2", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        cwd=BASE_DIR, env=_child_env(DATABASE_URL=_test_database_url()),
        log_path=log, fresh_log=True,
    )  # fmt: skip

    def victim_serves():
        replies = app.control.inspect(timeout=1.0).active_queues() or {}
        return any(name.startswith("decode@victim") for name in replies)

    wait_until(victim_serves, timeout_s=60, message="the victim worker")
    wait_until(lambda: EMBEDDER_WARM_LOG in log.read_text(errors="replace"), timeout_s=180, interval_s=1,
               message="the victim worker to load its embedder")  # fmt: skip
    try:
        yield SimpleNamespace(process=process, session_decode=session_decode)
    finally:
        _stop(process)  # already dead after the test, or stopped here if it failed early
        app.control.add_consumer("decode", destination=session_decode, reply=True)


def test_the_workers_load_their_embedder_as_they_start_not_on_the_first_job(workers):
    # Each of them logs it once loaded; a job (or an upload) that needs the embedder first would
    # only load it.
    names = ("prefill-worker", "decode-worker", "ingest-worker")
    logs = {name: Path(settings.VAR_DIR) / "logs" / f"{name}.log" for name in names}

    def warmed() -> bool:
        return all(path.is_file() and EMBEDDER_WARM_LOG in path.read_text(errors="replace") for path in logs.values())

    wait_until(warmed, timeout_s=180, interval_s=1, message=f"'{EMBEDDER_WARM_LOG}' in {sorted(logs)}")


def test_a_job_whose_worker_is_killed_is_handed_on_and_finished(alice, victim_decode_worker, engine_host):
    job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=160, ignore_eos=True)
    wait_until(lambda: "delta" in _events(job.pk), timeout_s=300, message="the victim to start streaming")
    os.killpg(victim_decode_worker.process.pid, signal.SIGKILL)  # no warm shutdown, no ack: a crash
    victim_decode_worker.process.wait()
    from appliance.celery import app

    # The session's decode worker takes over; its watchdog hands the job on.
    app.control.add_consumer("decode", destination=victim_decode_worker.session_decode, reply=True)
    job = wait_until(lambda: _finished(job.pk), timeout_s=600, message="the job to be finished by another worker")
    assert job.state == Job.State.SUCCEEDED, job.error
    assert job.attempts == 2
    assert job.metrics.output_tokens == 160
    events = _events(job.pk)
    assert "restart" in events  # the browser drops the first attempt's text
    # What the browser shows after the restart is exactly the stored result.
    after_restart = streaming.sync_client().xrange(streaming.stream_key(job.pk))
    last_restart = max(i for i, (_, fields) in enumerate(after_restart) if fields[b"event"] == b"restart")
    import json

    text = "".join(json.loads(f[b"data"])["text"] for _, f in after_restart[last_restart:] if f[b"event"] == b"delta")
    assert text.strip() == job.result_text


def test_jobs_in_flight_when_the_engine_host_crashes_finish_after_it_is_back(alice, workers, engine_hosts, engine_host):
    job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=150, ignore_eos=True)
    wait_until(lambda: "delta" in _events(job.pk), timeout_s=300, message="the job to start streaming")
    engine_hosts.kill()
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == Job.State.QUEUED,
        timeout_s=60,
        message="the job to wait for the engine",
    )
    assert "waiting" in _events(job.pk)
    engine_hosts.ensure_running()  # what make run's supervisor does
    job = wait_until(lambda: _finished(job.pk), timeout_s=600, message="the job to finish after the restart")
    assert job.state == Job.State.SUCCEEDED, job.error
    assert job.metrics.output_tokens == 150
    assert job.attempts == 1  # the engine's outage did not count against the job


def _kill_engine_core(engine_host) -> int:
    """SIGKILL vLLM's engine core process (the engine host, its parent, lives on)."""
    import psutil

    host = psutil.Process(int(engine_host.stats()["pid"]))
    cores = [p for p in host.children(recursive=True) if p.cmdline()[:1] == ["VLLM::EngineCore"]]
    assert len(cores) == 1, [p.cmdline() for p in host.children(recursive=True)]
    cores[0].kill()
    return cores[0].pid


def _health(browser) -> tuple[int, dict]:
    response = browser.get("/healthz")
    return response.status_code, response.json()


def test_a_job_in_flight_when_the_engine_core_dies_succeeds_after_the_host_restarts_it(
    alice, workers, engine_host, browser, live_appliance
):
    """The job in flight is a /v1 stream, which the web process runs itself (nobody was waiting):
    put back to the decode queue when the engine dies, a worker finishes it, and the client's
    stream goes on from where it was to the stored answer."""
    import openai

    from api.services import token_create

    restarts = engine_host.stats()["restarts"]
    _, raw = token_create(user=alice, name="engine death", scopes=["read", "write"])
    client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=900)
    stream = iter(
        client.chat.completions.create(
            # Sampled, with no seed (OpenAI's default temperature): the attempt after the restart
            # draws the first's seed (``running.replay_seed``) and writes the same answer.
            model=engine_host.stats()["model"], messages=LETTER, max_tokens=100, temperature=1, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    chunks = [next(stream)]  # the first token has been written
    job = Job.objects.get(pk=chunks[0].id.removeprefix("chatcmpl-"))
    assert job.dispatched_at is None  # run by the web process, not sent to a worker
    _kill_engine_core(engine_host)
    wait_until(lambda: engine_host.stats()["state"] == "restarting", timeout_s=30, message="the host to notice")
    status, health = _health(browser)
    assert status == 503 and health["engine"]["state"] == "restarting"
    later = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=20, ignore_eos=True)  # while it restarts
    chunks += list(stream)  # through the restart, to the end
    job = wait_until(lambda: _finished(job.pk), timeout_s=900, message="the job to finish after the restart")
    assert job.state == Job.State.SUCCEEDED, job.error
    assert job.metrics.output_tokens == 100
    assert job.engine_crashes == 1  # counted against it, in case it was the cause, but retried
    assert job.dispatched_at is not None  # put back to its queue, and a worker finished it
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == job.result_text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    later = wait_until(lambda: _finished(later.pk), timeout_s=600, message="the job created during the restart")
    assert later.state == Job.State.SUCCEEDED, later.error
    assert later.engine_crashes == 0  # it was not in the engine when it died
    stats = engine_host.stats()
    assert stats["state"] == "ready" and stats["restarts"] == restarts + 1
    assert any(rid.startswith(str(job.pk)) for rid in stats["last_engine_death"]["in_flight"])
    # The new engine's model got its cores again, not the one the host had kept itself on.
    if stats.get("service_cpus"):
        assert stats["model_cpus"] and not set(stats["model_cpus"]) & set(stats["service_cpus"])
    wait_until(lambda: _health(browser)[0] == 200, timeout_s=120, message="/healthz to be green again")


def test_a_job_in_the_engine_both_times_it_dies_is_failed_and_not_retried(alice, workers, engine_host):
    job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=2000, ignore_eos=True)
    for crash in (1, 2):
        wait_until(
            lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING and engine_host.stats()["state"] == "ready"
            and engine_host.stats()["requests_in_host"] >= 1,
            timeout_s=900,
            message=f"the job to be in the engine before crash {crash}",
        )  # fmt: skip
        wait_until(lambda: engine_host.stats()["running"] >= 1, timeout_s=300, message="the job to run")
        _kill_engine_core(engine_host)
        wait_until(lambda: engine_host.stats()["state"] == "restarting", timeout_s=30, message="the host to notice")
    job = wait_until(lambda: _finished(job.pk), timeout_s=900, message="the job to be given up")
    assert job.state == Job.State.FAILED
    assert job.engine_crashes == 2
    assert "engine" in job.error and "not tried again" in job.error
    wait_until(lambda: engine_host.stats()["state"] == "ready", timeout_s=900, message="the engine to be back")


def test_cancelling_a_document_job_while_its_prompt_is_read_frees_the_engine_at_once(alice, workers, engine_host):
    from documents.models import Document, Page

    document = Document.objects.create(
        owner=alice,
        title="Supply contract",
        filename="supply.txt",
        size_bytes=1,
        sha256="1" * 64,
        state=Document.State.READY,
    )
    text = " ".join(f"Clause {i}: the supplier delivers the goods to the customer every Friday." for i in range(350))
    Page.objects.create(document=document, number=1, text=text)
    drafter = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=300, ignore_eos=True)
    wait_until(lambda: "delta" in _events(drafter.pk), timeout_s=300, message="the drafter to stream")
    summary = services.job_create_summary(owner=alice, document=document, length="short")

    def reading():
        import json

        return any(
            fields[b"event"] == b"progress" and json.loads(fields[b"data"]).get("prompt_tokens_done")
            for _, fields in streaming.sync_client().xrange(streaming.stream_key(summary.pk))
        )

    def released():
        # The drafter may have finished by now or not: only the summary's own requests count.
        stats = engine_host.stats()
        mine = [rid for rid in stats["request_ids"] + stats["admitted_request_ids"] if rid.startswith(f"{summary.pk}-")]
        return not mine

    wait_until(reading, timeout_s=120, message="the summary to report reading its prompt")
    assert not released()  # its prompt is being read: its request is in the host
    assert services.job_cancel(job=summary)

    wait_until(released, timeout_s=15, message="the engine host to drop the cancelled summary")
    drafter = wait_until(lambda: _finished(drafter.pk), timeout_s=300, message="the drafter")
    assert drafter.state == Job.State.SUCCEEDED
    summary.refresh_from_db()
    assert summary.state == Job.State.CANCELLED and "delta" not in _events(summary.pk)


def _ready_document(owner, title: str, pages: list[str]):
    from documents.models import Document, Page

    document = Document.objects.create(
        owner=owner, title=title, filename=f"{title}.txt", size_bytes=1, sha256=title.encode().hex()[:64].ljust(64, "0"),
        state=Document.State.READY, pages_total=len(pages), pages_done=len(pages),
    )  # fmt: skip
    Page.objects.bulk_create([Page(document=document, number=i, text=text) for i, text in enumerate(pages, start=1)])
    return document


def test_clause_extraction_returns_only_quotes_that_are_in_the_pages(alice, workers, engine_host, browser):
    from tests.pdfs import CONTRACT_PAGES

    document = _ready_document(alice, "Services agreement", CONTRACT_PAGES)
    job = services.job_create_clauses(owner=alice, document=document, taxonomy="office")
    job = wait_until(lambda: _finished(job.pk), timeout_s=600, message="the clause extraction")
    assert job.state == Job.State.SUCCEEDED, job.error
    data = job.result_data
    assert data["sections"] == 1
    assert data["proposed"] == len(data["clauses"]) + data["dropped"] + (
        data["proposed"] - len(data["clauses"]) - data["dropped"]
    )
    texts = {n: t for n, t in enumerate(CONTRACT_PAGES, start=1)}
    for clause in data["clauses"]:
        # Whatever the small model wrote, what is kept is the page's own text at that place: one
        # of the sentences it was offered (single-spaced, across line and page breaks), or the
        # stored text where a free-text quote was found.
        first, last = clause["page"], clause["end_page"]
        if first == last:
            at = texts[first][clause["start"] : clause["end"]]
        else:
            at = texts[first][clause["start"] :] + "\n" + texts[last][: clause["end"]]
        if clause["match"] == "candidate":
            assert clause["quote"].split() == at.replace("-\n", "").split() or first != last
            assert at.startswith(clause["quote"].split()[0]) and at.endswith(clause["quote"].split()[-1])
        else:
            assert at == clause["quote"]
        assert clause["category"] in data["categories"]
    assert f"{data['dropped']} quote(s)" in job.result_note
    assert job.metrics.queue == Queue.PREFILL and job.metrics.engine_requests == 1

    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Export:" in page
    exported = browser.get(f"/jobs/{job.pk}/clauses.csv")
    assert exported.status_code == 200 and exported["Content-Type"].startswith("text/csv")
    assert exported.content.decode().splitlines()[0] == "category,page,end_page,quote,note,match"
    as_json = browser.get(f"/jobs/{job.pk}/clauses.json").json()
    assert as_json["clauses"] == data["clauses"]


def test_a_document_longer_than_the_context_is_summarised_section_by_section(alice, workers, engine_host):
    # ~8,000 tokens over 12 pages: more than one section of an 8192-token context (6,656 tokens of
    # document each), and no more, since this CPU reads about 40 prompt tokens a second.
    pages = [
        " ".join(
            f"Page {n}, clause {i}: the tenant pays rent of {n * 100 + i} pounds on day {i} of each month."
            for i in range(24)
        )
        for n in range(1, 13)
    ]
    document = _ready_document(alice, "Long lease", pages)
    job = services.job_create_summary(owner=alice, document=document, length="short")
    job = wait_until(lambda: _finished(job.pk), timeout_s=1200, message="the long summary")
    assert job.state == Job.State.SUCCEEDED, job.error
    sections = job.result_data["sections"]
    partials = job.result_data["partials"]
    assert len(sections) >= 2 and [p["pages"] for p in partials] == sections
    assert sections[0].startswith("pages 1-") and sections[-1].endswith("12")  # every page was read
    assert job.metrics.engine_requests == len(sections) + 1
    assert "read in" in job.result_note and job.result_text
    events = _events(job.pk)
    assert "progress" in events and events.index("progress") < events.index(
        "delta"
    )  # parts first, then the answer streams
    # The sections were read two at a time (the prefill queue's cap), with an estimate of the rest.
    steps = [
        json.loads(fields[b"data"])["step"]
        for _, fields in streaming.sync_client().xrange(streaming.stream_key(job.pk))
        if fields[b"event"] == b"progress" and "step" in json.loads(fields[b"data"])
    ]
    assert f"Reading the document: {len(sections)} parts, 2 at a time" in steps, steps
    if len(sections) > 2:
        assert any(" parts done, about " in step for step in steps), steps
