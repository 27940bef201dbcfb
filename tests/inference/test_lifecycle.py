"""inference/lifecycle.py in one process: claims by fair share, the attempt's fencing token, its
deadline, engine deaths, checkpoints, and the watchdog. The database and the broker's streams are
the real ones; the engine is a fake (``FakeEngine``), and where a turn would be published to a
Celery queue a recorder takes it (``sent``)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from documents.models import Document, Page
from inference import fencing, lifecycle, placement, running, selectors, services, streaming
from inference.attempts import RECORDED, Attempt, StopReason
from inference.engine.client import EngineRestarting, EngineUnavailable, StreamEvent
from inference.fairshare import Waiting, claim_order
from inference.job_results import ChatResult
from inference.lifecycle import engine_retry_delays_s
from inference.models import Job, JobKind, Queue
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the attempt's watch thread has its own connection
    pytest.mark.usefixtures("workers_held"),  # no live worker of an earlier test claims these rows
]

LETTER = [{"role": "user", "content": "Write a reply to a supplier who asks when the invoice will be paid."}]


class FakeEngine:
    """A fake of ``EngineClient``. ``script(request)`` returns what the engine does for a request:
    a list of texts (one delta each; a ``(text, finish_reason)`` pair for a last text that says
    why it ends), callables (run between two events, e.g. the watchdog), and exceptions (raised
    there). It records each request, and the ones the worker closed early."""

    address = "unix:/fake/engine.sock"

    def __init__(self, script=None, *, max_model_len: int = 8192, model: str = "fake", room: bool = True) -> None:
        self.script = script or (lambda request: ["Dear supplier,", " it is paid."])
        self.room = room
        self.max_model_len = max_model_len
        self.model = model
        self.requests = []
        self.closed_early: list[str] = []

    def stats(self, *, timeout_s: float = 5.0) -> dict:
        waiting = 0 if self.room else 3  # a full engine: requests wait for admission in its host
        return {"max_model_len": self.max_model_len, "model": self.model, "state": "ready",
                "waiting_for_admission": waiting}  # fmt: skip

    def count_tokens(self, prompts, *, timeout_s: float = 60.0) -> list[int]:
        return [sum(len(m["content"]) for m in prompt) // 4 + 3 * len(prompt) for prompt in prompts]

    def generate(self, request, *, idle_timeout_s=None, opened=None):
        self.requests.append(request)
        aborted = threading.Event()
        if opened is not None:
            opened(aborted.set)
        return self._events(request, aborted)

    def _events(self, request, aborted):
        finished = False
        try:
            yield StreamEvent("admitted", {"type": "admitted", "prompt_tokens": 10, "model": self.model}, time.time())
            tokens = 0
            for item in self.script(request):
                if aborted.is_set():
                    return
                if isinstance(item, BaseException):
                    raise item
                if callable(item):
                    item()
                    continue
                tokens += 1
                delta = {"type": "delta", "text": item, "tokens": 1}
                if isinstance(item, tuple):  # (text, why): the last text, saying why it ends, as the host's does
                    delta["text"], delta["finish_reason"] = item
                yield StreamEvent("delta", delta, time.time())
            yield StreamEvent("done", {"type": "done", "prompt_tokens": 10, "output_tokens": tokens}, time.time())
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request.request_id)


@pytest.fixture
def sent(monkeypatch):
    """A recorder in place of the broker's Celery queues: (job id, Celery queue, countdown)."""
    recorded: list[tuple[str, str | None, float | None]] = []

    def publish_turn(job_id, *, countdown_s=None, celery_queue=None, hops=0, to_queue=None):
        recorded.append((str(job_id), to_queue or celery_queue, countdown_s))
        return True

    monkeypatch.setattr(lifecycle, "_publish_turn", publish_turn)
    return recorded


def _events(job_id) -> list[tuple[str, dict]]:
    return [
        (fields[b"event"].decode(), json.loads(fields[b"data"]))
        for _, fields in streaming.sync_client().xrange(streaming.stream_key(job_id))
    ]


def _job(owner, *, state=Job.State.QUEUED, queue=Queue.DECODE, minutes_ago: float = 0, **fields) -> Job:
    kind = JobKind.SUMMARISE if queue == Queue.PREFILL else JobKind.CHAT
    options = {"messages": LETTER, "max_tokens": 20} if kind == JobKind.CHAT else {"length": "short"}
    job = Job.objects.create(owner=owner, kind=kind, queue=queue, state=state, options=options, **fields)
    if minutes_ago:
        Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return job


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="another long password")


# --- fair share ------------------------------------------------------------------------------


def test_a_turn_takes_the_next_job_by_fair_share_not_the_one_it_was_sent_for(alice, bob, sent):
    batch = [_job(alice, minutes_ago=10 - i) for i in range(3)]
    _job(alice, state=Job.State.RUNNING, claimed_at=timezone.now())
    single = _job(bob)  # queued last
    engine = FakeEngine()
    done = lifecycle.job_run_next(celery_queue="decode", job_id=batch[0].pk, client=engine)
    assert done.pk == single.pk and done.state == Job.State.SUCCEEDED
    assert engine.requests[0].user == str(bob.pk)  # the engine is told whose request it is
    # Then alice's oldest, and the order shown to waiting jobs is the order they are taken in.
    assert selectors.queue_positions(celery_queue="decode") == {batch[0].pk: 1, batch[1].pk: 2, batch[2].pk: 3}
    assert lifecycle.job_claim_next(celery_queue="decode").pk == batch[0].pk


def test_the_claim_and_the_positions_follow_the_same_rule(alice, bob, django_user_model):
    carol = django_user_model.objects.create_user(username="carol", password="a third long password")
    now = timezone.now()
    _job(alice, minutes_ago=9)
    _job(alice, minutes_ago=8)
    _job(bob, minutes_ago=7)
    _job(carol, minutes_ago=1)
    _job(bob, state=Job.State.SUCCEEDED, claimed_at=now - timedelta(minutes=2))  # bob was served lately
    _job(alice, state=Job.State.SUCCEEDED, claimed_at=now - timedelta(minutes=30))
    waiting = [
        Waiting(j.pk, j.owner_id, j.created_at) for j in Job.objects.filter(state=Job.State.QUEUED, queue="decode")
    ]
    expected = claim_order(
        waiting, running={}, last_served={alice.pk: now - timedelta(minutes=30), bob.pk: now - timedelta(minutes=2)}
    )
    positions = selectors.queue_positions(celery_queue="decode")
    assert sorted(positions, key=positions.get) == expected
    claimed = []
    while (job := lifecycle.job_claim_next(celery_queue="decode")) is not None:
        claimed.append(job.pk)
    # Claims change the running counts as they go, as claim_order plays them forward.
    assert claimed == expected
    assert Job.objects.get(pk=expected[0]).owner_id == carol.pk  # never served, nothing running


def test_a_row_another_transaction_holds_is_skipped_not_waited_for(alice, bob):
    import psycopg

    first = _job(alice, minutes_ago=5)
    second = _job(bob, minutes_ago=1)
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"], dbname=db["NAME"]
    ) as other:
        other.execute("SELECT id FROM inference_job WHERE id = %s FOR UPDATE", (first.pk,))
        assert lifecycle.job_claim_next(celery_queue="decode").pk == second.pk


def test_a_job_whose_row_is_held_for_a_moment_is_waited_for_not_left_to_a_later_turn(alice, monkeypatch):
    import threading

    import psycopg

    db = connection.settings_dict
    params = {
        "host": db["HOST"],
        "port": db["PORT"],
        "user": db["USER"],
        "password": db["PASSWORD"],
        "dbname": db["NAME"],
    }
    only = _job(alice)
    # Its creator holds its row for a moment after sending its message (to record that it was sent).
    other = psycopg.connect(**params)
    other.execute("SELECT id FROM inference_job WHERE id = %s FOR UPDATE", (only.pk,))
    release = threading.Timer(0.3, other.commit)
    release.start()
    try:
        claimed = lifecycle.job_claim_next(celery_queue="decode")
    finally:
        release.join()
        other.close()
    assert claimed is not None and claimed.pk == only.pk and claimed.state == Job.State.RUNNING
    # Held past the wait: nothing is claimed (the turn comes back later), and the next claim works.
    monkeypatch.setattr(lifecycle, "HELD_ROW_WAIT_MS", 100)
    again = _job(alice)
    with psycopg.connect(**params) as holder:
        holder.execute("SELECT id FROM inference_job WHERE id = %s FOR UPDATE", (again.pk,))
        assert lifecycle.job_claim_next(celery_queue="decode") is None
    assert lifecycle.job_claim_next(celery_queue="decode").pk == again.pk


def test_a_turn_that_finds_only_jobs_waiting_for_the_engine_comes_back_when_the_first_may_start(alice, sent):
    later = timezone.now() + timedelta(seconds=20)
    waiting = _job(alice, not_before=later)
    assert lifecycle.job_run_next(celery_queue="decode", job_id=waiting.pk, client=FakeEngine()) is None
    assert len(sent) == 1 and sent[0][1] == "decode" and 10 < sent[0][2] <= 20
    Job.objects.filter(pk=waiting.pk).update(state=Job.State.CANCELLED)
    assert lifecycle.job_run_next(celery_queue="decode", job_id=waiting.pk, client=FakeEngine()) is None
    assert len(sent) == 1  # nothing waits any more: the turn ends


def test_under_fifo_both_kinds_share_the_prefill_queue_and_its_turns(alice, bob, sent):
    document = Document.objects.create(
        owner=alice, title="Lease", filename="l.txt", size_bytes=1, sha256="0" * 64, state=Document.State.READY
    )
    with override_settings(APPLIANCE_SCHEDULING="fifo"):
        summary = services.job_create_summary(owner=alice, document=document)
        chat = services.job_create_chat(owner=bob, messages=LETTER, max_tokens=5)
    assert {summary.celery_queue, chat.celery_queue} == {"prefill"}
    Job.objects.filter(pk=summary.pk).update(claimed_at=timezone.now())  # alice was served lately
    # A prefill worker (whose own settings say nothing of fifo) takes bob's chat by fair share.
    assert lifecycle.job_claim_next(celery_queue="prefill").pk == chat.pk


# --- the fencing token -----------------------------------------------------------------------
def _stale_here_only(settings):
    """A heartbeat time that this test's sweep finds stale but the live workers' watchdogs (which
    sweep the same test database every 2 s, once a test module has started them) do not yet: the
    test process's heartbeat timeout is cut to 1 s, theirs stays at 8 s."""
    settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S = 1
    return timezone.now() - timedelta(seconds=3)


def test_a_slow_attempt_handed_on_by_the_watchdog_writes_nothing_more(alice, sent, settings):
    job = _job(alice)

    def hand_on():  # the watchdog, while the first attempt is in the middle of its stream
        Job.objects.filter(pk=job.pk).update(heartbeat_at=_stale_here_only(settings))
        assert lifecycle.jobs_recover_stale() == (1, 0)

    pause = lambda: time.sleep(0.15)  # noqa: E731 - long enough that the next delta is sent at once
    engine = FakeEngine(lambda request: ["First", " attempt", hand_on, pause, " more", " text", " and more"])
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.QUEUED and result.result_text == ""  # nothing stored
    assert engine.closed_early == [f"{job.pk}-1-chat"]  # its engine request was closed
    events = _events(job.pk)
    assert [e for e, _ in events][-1] == "waiting"  # the hand-on is the last word: no " more"
    # Every delta before the hand-on was published as it came (PUBLISH_INTERVAL_S is 0); none after.
    assert "".join(d["text"] for e, d in events if e == "delta") == "First attempt"
    assert sent == [(str(job.pk), job.celery_queue, None)]
    # The next attempt runs it to the end; the browser drops what the first one streamed.
    second = lifecycle.job_run(job_id=job.pk, client=FakeEngine())
    assert second.state == Job.State.SUCCEEDED and second.attempts == 2
    assert second.result_text == "Dear supplier, it is paid."
    names = [e for e, _ in _events(job.pk)]
    assert names[names.index("waiting") + 1] == "restart" and names[-1] == "done"


def test_the_watch_thread_stops_an_attempt_whose_claim_is_lost_between_two_events(alice):
    job = _job(alice, state=Job.State.RUNNING, attempts=1)
    streaming.fence_hold(job.pk, 1)
    attempt = Attempt.starting_now(job.pk, 1, limit_s=600)
    closed = threading.Event()
    attempt.opened(closed.set)
    with override_settings(APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S=0.2), fencing.attempt_watch(attempt):
        Job.objects.filter(pk=job.pk).update(state=Job.State.QUEUED)  # handed on
        wait_until(lambda: attempt.reason is not None, timeout_s=30, message="the watch thread")
    assert attempt.reason is StopReason.CLAIM_LOST
    assert closed.is_set()  # its engine request was closed without waiting for an event


def test_a_stream_event_of_an_attempt_that_lost_the_fence_is_refused(alice):
    job = _job(alice)
    streaming.fence_hold(job.pk, 1)
    assert streaming.publish_fenced(job.pk, "delta", {"text": "a"}, attempt=1) is streaming.Outcome.SENT
    streaming.fence_hold(job.pk, 2)  # a newer attempt claimed it
    streaming.fence_release(job.pk, 1)  # clearing the old attempt's fence leaves the new one's
    assert streaming.publish_fenced(job.pk, "delta", {"text": "b"}, attempt=1) is streaming.Outcome.FENCED
    assert streaming.publish_fenced(job.pk, "delta", {"text": "c"}, attempt=2) is streaming.Outcome.SENT
    assert streaming.publish_fenced(job.pk, "waiting", {}, attempt=None) is streaming.Outcome.FENCED  # held
    assert [d["text"] for _, d in _events(job.pk)] == ["a", "c"]
    services.job_cancel(job=job)  # takes the fence from whoever holds it, and says why
    assert streaming.publish_fenced(job.pk, "delta", {"text": "d"}, attempt=2) is streaming.Outcome.CANCELLED
    assert [d.get("text") for _, d in _events(job.pk)] == ["a", "c", None]  # then only "cancelled"


def test_a_cancelled_job_is_not_stored_and_its_request_is_closed(alice, sent):
    job = _job(alice)
    cancel = lambda: services.job_cancel(job=job) and time.sleep(0.15)  # noqa: E731
    engine = FakeEngine(lambda request: ["One", cancel, " two", " three", " four"])
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.CANCELLED and result.result_text == ""
    assert engine.closed_early == [f"{job.pk}-1-chat"]
    assert [e for e, _ in _events(job.pk)][-1] == "cancelled"


def test_a_raw_completion_is_stored_verbatim_and_a_nul_the_model_writes_costs_one_character(alice, sent):
    """A raw prompt's answer keeps its whitespace (a chat answer is trimmed); a byte token that
    decodes to NUL, which Postgres cannot store, is U+FFFD in the stream and the stored answer
    alike, instead of failing the job at its end."""
    job = _job(alice)
    Job.objects.filter(pk=job.pk).update(options={"messages": [], "prompt": "Once upon", "max_tokens": 20})
    engine = FakeEngine(lambda request: [" a", " time\x00", ("\n", "stop")])
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.SUCCEEDED and result.result_text == " a time\ufffd\n"
    assert engine.requests[0].prompt == "Once upon" and engine.requests[0].messages == []
    deltas = [data for event, data in _events(job.pk) if event == "delta"]
    assert "".join(data["text"] for data in deltas) == result.result_text
    # The engine's last text says why it ended, and the worker passes that on with it.
    assert [data.get("finish_reason") for data in deltas] == [None, None, "stop"]
    chat = _job(alice)
    engine = FakeEngine(lambda request: ["  Dear", " Sir.", "\n"])
    assert lifecycle.job_run(job_id=chat.pk, client=engine).result_text == "Dear Sir."


def test_a_result_is_stored_as_postgres_can_store_it_whatever_the_runner_parsed(alice, sent, monkeypatch):
    """What a runner makes of the model's answer (a clause's note or quote parsed from a JSON
    escape "\\u0000") can hold a NUL or a lone surrogate: each is stored as U+FFFD, and the job
    succeeds instead of failing at its end."""
    job = _job(alice)

    def runner(job, client, attempt):
        run = running.run_engine(job, running.engine_request(job, LETTER, 20, part="chat"), client, attempt)
        return running.TaskResult(text="a\x00b", note="n\ud800", data=ChatResult(finish_reason="x\x00"), runs=[run])

    monkeypatch.setitem(running.RUNNERS, JobKind.CHAT, runner)
    result = lifecycle.job_run(job_id=job.pk, client=FakeEngine())
    assert result.state == Job.State.SUCCEEDED
    assert (result.result_text, result.result_note, result.result_data) == (
        "a\ufffdb",
        "n\ufffd",
        {"finish_reason": "x\ufffd"},
    )


# --- a job its creator runs itself (/v1 in the web process) ----------------------------------

HI = [{"role": "user", "content": "hi"}]


def test_a_chat_is_claimed_by_its_creator_only_when_its_queue_would_start_it_at_once(alice, bob, sent, settings):
    settings.APPLIANCE_DECODE_CONCURRENCY = 2
    mine = services.job_create_chat(owner=alice, messages=HI, claim_for="box:engine")
    mine.refresh_from_db()
    assert (mine.state, mine.attempts, mine.engine, mine.dispatched_at) == (Job.State.RUNNING, 1, "box:engine", None)
    assert mine.claimed_at is not None and mine.heartbeat_at is not None and sent == []  # no worker was told
    # Someone waits ahead in the queue: the next one waits its turn, sent to the workers.
    waiting = _job(bob, celery_queue=Queue.DECODE)
    queued = services.job_create_chat(owner=alice, messages=HI, claim_for="box:engine")
    assert queued.state == Job.State.QUEUED and sent == [(str(queued.pk), Queue.DECODE, None)]
    # One held back until later (waiting for the engine) is not ahead of it.
    Job.objects.filter(pk__in=[waiting.pk, queued.pk]).update(not_before=timezone.now() + timedelta(minutes=5))
    second = services.job_create_chat(owner=alice, messages=HI, claim_for="box:engine")
    assert second.state == Job.State.RUNNING
    # The queue's threads are all taken (two running): the third goes to the workers.
    third = services.job_create_chat(owner=alice, messages=HI, claim_for="box:engine")
    assert third.state == Job.State.QUEUED
    # Without ``claim_for`` (the pages, the benchmarks, the jobs API) nothing changes.
    Job.objects.filter(state=Job.State.RUNNING).update(state=Job.State.SUCCEEDED)
    assert services.job_create_chat(owner=alice, messages=HI).state == Job.State.QUEUED


def test_a_job_run_by_its_creator_hands_it_each_token_at_once_and_records_them_in_batches(alice, sent, monkeypatch):
    monkeypatch.setattr(running, "LISTENED_PUBLISH_INTERVAL_S", 60)  # one batch after the first token
    job = services.job_create_chat(owner=alice, messages=LETTER, claim_for="box:engine")
    heard: list[tuple[str, str, dict]] = []
    engine = FakeEngine(lambda request: ["Dear", " supplier,", " it", " is", (" paid.", "stop")])
    done = lifecycle.job_run_claimed(job_id=job.pk, client=engine, listener=lambda *event: heard.append(event))
    assert done.state == Job.State.SUCCEEDED and done.result_text == "Dear supplier, it is paid."
    stream = streaming.sync_client().xrange(streaming.stream_key(job.pk))
    written = [(i.decode(), f[b"event"].decode(), json.loads(f[b"data"])) for i, f in stream]
    # Every token was heard by itself, as it came, before the stream had it (no stream id) ...
    tokens = [(i, data) for i, e, data in heard if e == "delta"]
    assert [data["text"] for _, data in tokens] == ["Dear", " supplier,", " it", " is", " paid."]
    assert all(i == "" and data["tokens"] == 1 and len(data["times"]) == 1 for i, data in tokens)
    assert tokens[-1][1]["finish_reason"] == "stop" and tokens[0][1]["prompt_tokens"] == 10
    # ... and the stream has them in two batches (the first token at once, then the rest with the
    # finish), each told to the listener by its stream id once recorded, after its tokens.
    deltas = [(i, data) for i, e, data in written if e == "delta"]
    assert [data["text"] for _, data in deltas] == ["Dear", " supplier, it is paid."]
    assert [data["tokens"] for _, data in deltas] == [1, 4] and deltas[-1][1]["finish_reason"] == "stop"
    recorded = [(n, i) for n, (i, e, _) in enumerate(heard) if e == RECORDED]
    assert [i for _, i in recorded] == [i for i, _ in deltas] and heard[-1][1] == RECORDED
    assert recorded[0][0] == 1  # right after the first token
    assert sent == []

    # Handed on while it writes: the next batch is refused, and nothing of it is recorded.
    job = services.job_create_chat(owner=alice, messages=LETTER, claim_for="box:engine")
    heard.clear()
    handed_on = lambda: streaming.fence_hold(job.pk, 2)  # noqa: E731 - another attempt holds it now
    engine = FakeEngine(lambda request: ["Dear", handed_on, " supplier", (" more", "stop"), " never"])
    lifecycle.job_run_claimed(job_id=job.pk, client=engine, listener=lambda *event: heard.append(event))
    assert [e for _, e, _ in heard] == ["delta", RECORDED, "delta", "delta"]  # the last batch was refused
    stream = streaming.sync_client().xrange(streaming.stream_key(job.pk))
    assert [json.loads(f[b"data"])["text"] for _, f in stream] == ["Dear"]
    assert engine.closed_early  # stopped there: " never" was not asked for


def test_v1_runs_in_the_web_process_only_on_this_machines_only_engine(settings, tmp_path, monkeypatch):
    from inference.openai_api import here

    socket = tmp_path / "engine.sock"
    socket.touch()
    settings.APPLIANCE_ENGINE_SOCKET, settings.APPLIANCE_ENGINE_URL = str(socket), ""
    key = lifecycle.this_engine(here.EngineClient.from_settings())
    view: list[placement.EngineView] = []  # a fake of the cluster view's engines for the decode queue
    monkeypatch.setattr(lifecycle, "engines_serving", lambda celery_queue: view)
    decode = frozenset({Queue.DECODE.value})

    assert here.engine_here().key == key  # nothing announced (one box, its workers beside it)
    view[:] = [placement.EngineView(key, True, True, decode)]
    assert here.engine_here().key == key
    view[:] = [placement.EngineView(key, False, False, decode)]
    assert here.engine_here() is None  # restarting: the workers wait for it
    view[:] = [placement.EngineView(key, True, True, decode), placement.EngineView("gpu2:e", True, True, decode)]
    assert here.engine_here() is None  # several engines: placement decides
    view.clear()
    settings.APPLIANCE_SCHEDULING = "fifo"
    assert here.engine_here() is None  # the benchmark's baseline: one queue for every job
    settings.APPLIANCE_SCHEDULING = "appliance"
    settings.APPLIANCE_V1_IN_WEB = False
    assert here.engine_here() is None
    settings.APPLIANCE_V1_IN_WEB = True
    socket.unlink()
    assert here.engine_here() is None  # a web node without an engine of its own


# --- the deadline ----------------------------------------------------------------------------


def test_a_job_past_its_time_limit_is_failed_with_a_reason_and_its_request_closed(alice, sent):
    job = _job(alice)

    def forever(request):
        while True:
            yield "token "
            time.sleep(0.02)

    engine = FakeEngine(forever)
    with override_settings(APPLIANCE_JOB_TIME_LIMIT_S=2):
        result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.FAILED
    assert "took longer than the 2 seconds the appliance allows" in result.error
    assert engine.closed_early == [f"{job.pk}-1-chat"]
    assert [e for e, _ in _events(job.pk)][-1] == "failed"


# --- engine deaths ---------------------------------------------------------------------------


def test_an_engine_death_in_flight_is_retried_soon_as_a_suspect_and_fails_the_job_the_second_time(alice, sent):
    job = _job(alice)
    died = EngineRestarting("the engine core died", in_flight=True)
    engine = FakeEngine(lambda request: ["Dear", died])
    first = lifecycle.job_run(job_id=job.pk, client=engine)
    assert first.state == Job.State.QUEUED and first.engine_crashes == 1
    assert first.attempts == 0  # not counted against MAX_ATTEMPTS
    assert first.not_before is not None and sent == [(str(job.pk), job.celery_queue, lifecycle.ENGINE_CRASH_RETRY_S)]
    assert engine.requests[0].suspect is False
    second = lifecycle.job_run(job_id=job.pk, client=engine)
    assert engine.requests[1].suspect is True  # the host runs it apart from the others
    assert second.state == Job.State.FAILED and second.engine_crashes == 2
    assert "it was in the engine both times the engine stopped" in second.error


def test_a_request_that_arrives_while_the_engine_restarts_waits_without_counting_a_crash(alice, sent):
    job = _job(alice)
    engine = FakeEngine(lambda request: [EngineRestarting("restarting", in_flight=False)])
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.QUEUED
    assert (result.engine_crashes, result.engine_waits, result.attempts) == (0, 1, 0)
    assert sent == [(str(job.pk), job.celery_queue, engine_retry_delays_s(600)[0])]


def test_a_job_that_cannot_reach_the_engine_for_the_whole_window_fails_with_a_reason(alice, sent):
    job = _job(alice, engine_waits=len(engine_retry_delays_s(600)))
    engine = FakeEngine(lambda request: [EngineUnavailable("the engine host is not answering")])
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.FAILED and "The engine is not available" in result.error


def test_retries_back_off_then_keep_trying_every_30_s_for_the_whole_window():
    delays = engine_retry_delays_s(600)
    assert delays[:5] == [2, 4, 8, 16, 30]
    assert set(delays[4:]) == {30}
    assert sum(delays) >= 600 > sum(delays[:-1])
    assert engine_retry_delays_s(0) == []


# --- checkpoints -----------------------------------------------------------------------------


def _long_document(owner) -> Document:
    document = Document.objects.create(
        owner=owner, title="Lease", filename="lease.txt", size_bytes=1, sha256="1" * 64,
        state=Document.State.READY, pages_total=6, pages_done=6,
    )  # fmt: skip
    for n in range(1, 7):
        Page.objects.create(document=document, number=n, text=f"Page {n}: the tenant pays rent on day {n}. " * 40)
    return document


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=1)  # one part at a time: which parts finish first is known
def test_a_retried_summary_resumes_from_its_finished_sections(alice, sent, monkeypatch):
    from inference import running

    monkeypatch.setattr(running, "summary_statements", lambda document, text: [])  # no embedder here
    document = _long_document(alice)
    job = services.job_create_summary(owner=alice, document=document, length="short")
    died = EngineRestarting("the engine core died", in_flight=True)

    def first_attempt(request):
        part = request.request_id.rsplit("-", 1)[1]
        return [died] if part == "s2" else [f"partial {part}"]

    engine = FakeEngine(first_attempt, max_model_len=2048)
    assert lifecycle.job_run(job_id=job.pk, client=engine).state == Job.State.QUEUED
    asked_first = [r.request_id.rsplit("-", 1)[1] for r in engine.requests]
    assert asked_first[:3] == ["s0", "s1", "s2"]
    assert len(Job.objects.get(pk=job.pk).checkpoint) == 2  # s0 and s1

    engine = FakeEngine(lambda request: [f"again {request.request_id.rsplit('-', 1)[1]}"], max_model_len=2048)
    done = lifecycle.job_run(job_id=job.pk, client=engine)
    assert done.state == Job.State.SUCCEEDED, done.error
    asked_again = [r.request_id.rsplit("-", 1)[1] for r in engine.requests]
    assert "s0" not in asked_again and "s1" not in asked_again and asked_again[0] == "s2"
    texts = [p["text"] for p in done.result_data["partials"]]
    assert texts[:3] == ["partial s0", "partial s1", "again s2"]
    assert done.result_data["resumed_parts"] == 2 and "kept from an earlier attempt" in done.result_note
    assert done.checkpoint == {}  # emptied once it is done


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=1)
def test_a_failed_summary_tried_again_starts_from_the_parts_it_finished_with_the_same_model(alice, sent, monkeypatch):
    from inference import running

    monkeypatch.setattr(running, "summary_statements", lambda document, text: [])  # no embedder here
    document = _long_document(alice)
    job = services.job_create_summary(owner=alice, document=document, length="short")

    def cut_off(request):  # the time limit passes while the third part is read
        part = request.request_id.rsplit("-", 1)[1]
        return [ValueError("stopped")] if part == "s2" else [f"partial {part}"]

    failed = lifecycle.job_run(job_id=job.pk, client=FakeEngine(cut_off, max_model_len=2048))
    assert failed.state == Job.State.FAILED and len(failed.checkpoint) == 2  # s0 and s1 stay with it

    again = services.job_retry(job=failed, user=alice)
    assert again.pk != job.pk and again.checkpoint == failed.checkpoint
    engine = FakeEngine(lambda request: [f"again {request.request_id.rsplit('-', 1)[1]}"], max_model_len=2048)
    done = lifecycle.job_run(job_id=again.pk, client=engine)
    assert done.state == Job.State.SUCCEEDED, done.error
    asked = [r.request_id.rsplit("-", 1)[1] for r in engine.requests]
    assert "s0" not in asked and "s1" not in asked and asked[0] == "s2"
    assert [p["text"] for p in done.result_data["partials"]][:3] == ["partial s0", "partial s1", "again s2"]
    assert done.result_data["resumed_parts"] == 2

    # Another model now: what the old one wrote is not used.
    Job.objects.filter(pk=again.pk).update(state=Job.State.FAILED)
    other = services.job_retry(job=Job.objects.get(pk=job.pk), user=alice)
    assert other.checkpoint == failed.checkpoint
    engine = FakeEngine(lambda request: ["new"], max_model_len=2048, model="another")
    done = lifecycle.job_run(job_id=other.pk, client=engine)
    assert done.state == Job.State.SUCCEEDED and done.result_data.get("resumed_parts", 0) == 0
    assert {"s0", "s1"} <= {r.request_id.rsplit("-", 1)[1] for r in engine.requests}


@override_settings(APPLIANCE_PREFILL_CONCURRENCY=2)
def test_parts_run_two_at_a_time_and_a_retry_asks_only_for_those_not_kept(alice, sent, monkeypatch):
    from inference import running

    monkeypatch.setattr(running, "summary_statements", lambda document, text: [])  # no embedder here
    document = _long_document(alice)
    job = services.job_create_summary(owner=alice, document=document, length="short")
    died = EngineRestarting("the engine core died", in_flight=True)
    engine = FakeEngine(lambda r: [died] if r.request_id.endswith("-s2") else [f"partial {r.request_id[-2:]}"],
                        max_model_len=2048)  # fmt: skip
    assert lifecycle.job_run(job_id=job.pk, client=engine).state == Job.State.QUEUED
    kept = len(Job.objects.get(pk=job.pk).checkpoint)
    assert 1 <= kept < len(engine.requests)  # what finished before the death is kept, s2 is not

    engine = FakeEngine(lambda r: [f"again {r.request_id[-2:]}"], max_model_len=2048)
    done = lifecycle.job_run(job_id=job.pk, client=engine)
    assert done.state == Job.State.SUCCEEDED, done.error
    sections = [p["text"].split()[1] for p in done.result_data["partials"]]
    assert sections == [f"s{i}" for i in range(len(sections))]  # in section order, whatever finished first
    again = {r.request_id[-2:] for r in engine.requests if "-s" in r.request_id}
    assert again == {p["text"].split()[1] for p in done.result_data["partials"] if p["text"].startswith("again")}
    assert "s2" in again and done.result_data["resumed_parts"] == kept == len(sections) - len(again)


def test_the_fingerprint_changes_with_anything_that_shapes_the_answer_but_not_the_attempt():
    from inference.engine.protocol import GenerateRequest
    from inference.running import request_fingerprint

    base = GenerateRequest(request_id="j-1-s0", messages=[{"role": "user", "content": "pages 1-3"}], max_tokens=320)
    same = GenerateRequest(
        request_id="j-2-s0",
        messages=[{"role": "user", "content": "pages 1-3"}],
        max_tokens=320,
        suspect=True,
        user="9",
        cache_salt="user-9",
    )
    other_pages = GenerateRequest(
        request_id="j-1-s0", messages=[{"role": "user", "content": "pages 1-4"}], max_tokens=320
    )
    other_options = GenerateRequest(
        request_id="j-1-s0", messages=[{"role": "user", "content": "pages 1-3"}], max_tokens=320, temperature=0.7
    )
    assert request_fingerprint(base) == request_fingerprint(same)
    assert request_fingerprint(base) != request_fingerprint(other_pages)
    assert request_fingerprint(base) != request_fingerprint(other_options)


def test_a_prompt_shares_the_prefix_cache_only_with_those_who_may_read_all_of_it(alice, django_user_model):
    """A document task of the document and the appliance's own words is shared with every task
    on that document; a focus, a draft, a chat (text a person wrote) only with its owner."""
    from inference.running import cache_salt

    bob = django_user_model.objects.create_user(username="bob", password="another long password")
    document = Document(pk=41, owner=alice, title="Lease")  # not saved: only its id is read

    def job(owner, kind, **options) -> Job:
        return Job(owner=owner, kind=kind, document=document if kind != JobKind.CHAT else None, options=options)

    summary, clauses = job(alice, JobKind.SUMMARISE), job(alice, JobKind.EXTRACT_CLAUSES, categories=["Governing Law"])
    assert cache_salt(summary) == cache_salt(job(bob, JobKind.SUMMARISE)) == cache_salt(clauses)
    assert cache_salt(job(bob, JobKind.SUMMARISE, focus="  ")) == cache_salt(summary)  # no focus written
    focused = job(alice, JobKind.SUMMARISE, focus="the rent review")
    assert cache_salt(focused) != cache_salt(job(bob, JobKind.SUMMARISE, focus="the rent review"))
    assert cache_salt(focused) != cache_salt(summary)
    chats = {cache_salt(job(owner, JobKind.CHAT)) for owner in (alice, bob)}
    drafts = {cache_salt(job(owner, JobKind.DRAFT)) for owner in (alice, bob)}
    assert len(chats) == len(drafts) == 2 and not chats & {cache_salt(summary)}
    assert cache_salt(focused) in chats  # a person's own requests share their own cache


# --- the watchdog ----------------------------------------------------------------------------


def test_the_watchdog_sends_a_dead_workers_job_again_once(alice, sent, settings):
    stale = _stale_here_only(settings)
    dead = _job(alice, state=Job.State.RUNNING, queue=Queue.PREFILL, attempts=1, started_at=stale, heartbeat_at=stale)
    alive = _job(alice, state=Job.State.RUNNING, attempts=1, started_at=stale, heartbeat_at=timezone.now())
    streaming.fence_hold(dead.pk, 1)
    assert lifecycle.jobs_recover_stale() == (1, 0)
    dead.refresh_from_db()
    alive.refresh_from_db()
    assert dead.state == Job.State.QUEUED and dead.heartbeat_at is None
    assert alive.state == Job.State.RUNNING
    assert sent == [(str(dead.pk), dead.celery_queue, None)]
    assert not streaming.sync_client().exists(streaming.fence_key(dead.pk))  # the old attempt lost it
    assert lifecycle.jobs_recover_stale() == (0, 0)  # sent once, not at every sweep


def test_a_job_that_keeps_killing_workers_fails_with_a_reason(alice, sent, settings):
    stale = _stale_here_only(settings)
    job = _job(alice, state=Job.State.RUNNING, attempts=lifecycle.MAX_ATTEMPTS, started_at=stale, heartbeat_at=stale)
    assert lifecycle.jobs_recover_stale() == (0, 1)
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert f"stopped {lifecycle.MAX_ATTEMPTS} times" in job.error
    assert sent == []


def test_the_watchdog_sends_a_queued_job_whose_message_was_never_published(alice, sent):
    lost = _job(alice, minutes_ago=5)  # committed, then its web process died before publishing
    fresh = _job(alice)  # its web process may still be publishing it
    done = _job(alice, minutes_ago=5)
    Job.objects.filter(pk=done.pk).update(dispatched_at=timezone.now())
    assert lifecycle.jobs_dispatch_pending() == 1
    assert sent == [(str(lost.pk), lost.celery_queue, None)]
    assert Job.objects.get(pk=lost.pk).dispatched_at is not None
    assert Job.objects.get(pk=fresh.pk).dispatched_at is None
    assert lifecycle.jobs_dispatch_pending() == 0


# --- placement across engines (the decisions: test_placement.py) -------------------------------

HERE = "this-node/unix:/fake/engine.sock"
OTHER = "other-node/unix:/run/engine.sock"


@pytest.fixture
def two_engines(monkeypatch, settings):
    """A fake cluster view: this worker's engine and another node's, up and with room."""
    settings.APPLIANCE_NODE_NAME = "this-node"
    other = {"name": "other-node", "roles": ["prefill", "decode", "engine"], "up": True,
             "engine_url": "unix:/run/engine.sock", "engine": {"state": "ready", "waiting_for_admission": 0}}  # fmt: skip
    monkeypatch.setattr(lifecycle.cluster, "nodes", lambda: [other])
    streaming.sync_client().delete(*streaming.sync_client().keys(f"{placement.AFFINITY_PREFIX}*") or ["-"])
    return other


def test_a_worker_whose_engine_is_full_passes_its_turn_to_an_engine_with_room(alice, sent, two_engines, settings):
    job = _job(alice)
    assert lifecycle.job_run_next(celery_queue="decode", job_id=job.pk, client=FakeEngine(room=False)) is None
    assert Job.objects.get(pk=job.pk).state == Job.State.QUEUED
    # To that engine's own queue, and a turn of the whole queue later, should its node have stopped.
    assert sent == [
        (str(job.pk), placement.direct_queue("decode", OTHER), None),
        (str(job.pk), "decode", settings.APPLIANCE_PLACEMENT_WAIT_S),
    ]
    # With no room there either, it is taken here and waits in this engine's host.
    two_engines["engine"]["waiting_for_admission"] = 1
    done = lifecycle.job_run_next(celery_queue="decode", job_id=job.pk, client=FakeEngine(room=False))
    assert done.pk == job.pk and done.state == Job.State.SUCCEEDED and done.engine == HERE


def test_a_documents_job_goes_to_the_engine_that_ran_its_last_job(alice, sent, two_engines):
    document = Document.objects.create(
        owner=alice, title="Held elsewhere", filename="h.txt", size_bytes=1, sha256="e" * 64, state=Document.State.READY
    )
    there = _job(alice, document=document, minutes_ago=0.1)  # queued first, 6 s ago
    lifecycle._remember_engine(document.pk, OTHER)
    other = _job(alice)
    done = lifecycle.job_run_next(celery_queue="decode", job_id=there.pk, client=FakeEngine())
    assert done.pk == other.pk  # the next job in fair-share order that no other engine holds
    # Only the document's job left: its turn is passed to the engine that holds it.
    assert lifecycle.job_run_next(celery_queue="decode", job_id=there.pk, client=FakeEngine()) is None
    assert sent[-2] == (str(there.pk), placement.direct_queue("decode", OTHER), None)
    # That engine goes down: the job is taken here, and remembered here.
    two_engines["up"] = False
    done = lifecycle.job_run_next(celery_queue="decode", job_id=there.pk, client=FakeEngine())
    assert done.pk == there.pk and done.engine == HERE
    assert lifecycle._remembered_engines([document.pk]) == {document.pk: HERE}


def test_a_job_handed_on_from_a_lost_engine_does_not_wait_for_that_engine(alice, sent, settings, two_engines):
    stale = _stale_here_only(settings)
    document = Document.objects.create(
        owner=alice, title="On a lost node", filename="l.txt", size_bytes=1, sha256="f" * 64, state=Document.State.READY
    )
    job = _job(alice, document=document, state=Job.State.RUNNING, attempts=1, started_at=stale, heartbeat_at=stale,
               engine=OTHER)  # fmt: skip
    lifecycle._remember_engine(document.pk, OTHER)
    assert lifecycle.jobs_recover_stale() == (1, 0)
    assert lifecycle._remembered_engines([document.pk]) == {}
    # The lost node still shows up for a few seconds; the job is taken here at once all the same.
    done = lifecycle.job_run_next(celery_queue="decode", job_id=job.pk, client=FakeEngine())
    assert done.pk == job.pk and done.engine == HERE


def test_a_job_on_a_node_shown_down_is_handed_on_before_the_full_heartbeat_timeout(alice, sent, settings, two_engines):
    settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S = 60
    half_stale = timezone.now() - timedelta(seconds=40)  # older than half the timeout, not all of it
    there = _job(alice, state=Job.State.RUNNING, attempts=1, started_at=half_stale, heartbeat_at=half_stale,
                 engine=OTHER)  # fmt: skip
    here = _job(alice, state=Job.State.RUNNING, attempts=1, started_at=half_stale, heartbeat_at=half_stale,
                engine=HERE)  # fmt: skip
    assert lifecycle.jobs_recover_stale() == (0, 0)  # its node still reports: it may only be slow
    two_engines["up"] = False
    assert lifecycle.jobs_recover_stale() == (1, 0)
    assert Job.objects.get(pk=there.pk).state == Job.State.QUEUED
    assert Job.objects.get(pk=here.pk).state == Job.State.RUNNING  # its node is not the one down


def test_a_job_running_elsewhere_or_gone_is_left_alone(alice):
    job = _job(alice, state=Job.State.RUNNING, attempts=1, started_at=timezone.now(), heartbeat_at=timezone.now())
    result = lifecycle.job_run(job_id=job.pk, client=object())  # never reaches the engine
    assert result.state == Job.State.RUNNING and result.attempts == 1
    assert lifecycle.job_run(job_id="00000000-0000-0000-0000-000000000000", client=object()) is None


# --- sending ---------------------------------------------------------------------------------


def test_a_job_whose_message_the_broker_refuses_after_the_commit_is_taken_back(alice, monkeypatch):
    from kombu.exceptions import OperationalError

    from appliance.broker import BrokerUnavailable

    def refuse(job_id, **kwargs):
        raise OperationalError("Error 111 connecting to the broker. Connection refused.")

    monkeypatch.setattr(lifecycle, "_publish_turn", refuse)
    with pytest.raises(BrokerUnavailable):
        services.job_create_chat(owner=alice, messages=LETTER, max_tokens=5)
    assert not Job.objects.exists()  # no queued row that nothing would run


def test_a_new_job_is_sent_to_its_queue_once_committed(alice, sent):
    job = services.job_create_chat(owner=alice, messages=LETTER, max_tokens=5)
    assert sent == [(str(job.pk), job.celery_queue, None)]
    job.refresh_from_db()
    assert job.celery_queue == "decode" and job.dispatched_at is not None


def test_a_job_queued_while_its_document_was_shared_is_not_run_after_the_share_is_withdrawn(alice, bob, sent):
    from django.contrib.auth.models import Group

    legal = Group.objects.create(name="legal")
    bob.groups.add(legal)
    document = _long_document(alice)
    document.shared_with.add(legal)
    job = services.job_create_summary(owner=bob, document=document, length="short")
    document.shared_with.remove(legal)
    engine = FakeEngine()
    result = lifecycle.job_run(job_id=job.pk, client=engine)
    assert result.state == Job.State.FAILED and "no longer shared with you" in result.error
    assert engine.requests == []  # nothing of the document reached the engine


def test_a_job_claimed_long_after_its_message_was_sent_is_logged_with_where_the_time_went(caplog):
    now = time.monotonic()
    late = Job(dispatched_at=timezone.now() - timedelta(seconds=0.9))
    with caplog.at_level("INFO", logger="inference.lifecycle"):
        # The turn began 0.3 s ago: 0.6 s went before it reached this thread, 0.2 s to the lock.
        lifecycle._note_slow_claim(late, began=now - 0.3, viewed=now - 0.29, locked=now - 0.09)
        lifecycle._note_slow_claim(Job(dispatched_at=timezone.now()), began=now, viewed=now, locked=now)  # prompt
        lifecycle._note_slow_claim(None, began=now - 5, viewed=now, locked=now)  # nothing was claimed
    lines = [r.getMessage() for r in caplog.records if "claimed" in r.getMessage()]
    assert len(lines) == 1
    import re

    parts = {
        name: int(ms) for name, ms in re.findall(r"(to a thread|cluster view|claim lock|claim) (\d+) ms", lines[0])
    }
    assert 590 <= parts["to a thread"] <= 610 and parts["cluster view"] == 10 and parts["claim lock"] == 200, lines
    assert parts["claim"] >= 90  # from the lock to now
