"""The engine host with the real model: stats, streaming, abort on disconnect, and the appliance's
scheduler inside vLLM (documents beside drafting, KV admission by blocks)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

from inference.engine.client import EngineRequestError
from inference.engine.protocol import EngineStats, GenerateRequest, Priority
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


def _request(**overrides) -> GenerateRequest:
    fields = {
        "request_id": f"test-{uuid.uuid4()}",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": 48,
        "priority": Priority.DECODE,
        "queue": "decode",
    }
    fields.update(overrides)
    return GenerateRequest(**fields)


def test_stats_describe_the_engine(engine_host):
    stats = engine_host.stats()
    assert stats["state"] == "ready"
    assert stats["scheduler_class"].startswith("inference.engine.vllm_scheduler.Appliance")
    assert stats["model"] == "SmolLM2-135M-Instruct"
    assert stats["licence"] == "Apache-2.0"
    assert stats["dtype"] in {"bfloat16", "float32", "float16"}
    assert stats["kv_cache_dtype"] in {"bfloat16", "float32", "float16"}  # "auto" is resolved
    assert stats["max_model_len"] == 8192
    assert stats["kv_capacity_tokens"] > 8192  # 2 GiB of KV holds several full contexts of this model
    assert stats["kv_budget_tokens"] < stats["kv_capacity_tokens"]  # the safety factor
    for key in ("running", "waiting", "kv_usage", "prefix_cache_hit_rate", "preemptions", "vllm_version", "device"):
        assert key in stats
    assert stats["enforce_eager"] is True  # the test settings: the suite's engines start uncompiled


def test_every_key_the_host_sends_in_stats_is_declared_for_its_readers(engine_host):
    stats = engine_host.stats()
    undeclared = sorted(set(stats) - {"type"} - set(EngineStats.field_names()))
    assert not undeclared, f"declare these on EngineStats: {undeclared}"
    engine = EngineStats.from_message(stats)
    assert (engine.model, engine.max_model_len, engine.state) == (stats["model"], stats["max_model_len"], "ready")
    assert engine.kv_budget_tokens == stats["kv_budget_tokens"] > 0


def test_the_weights_dtype_follows_what_the_cpu_computes_in():
    from inference.engine.host import cpu_weight_dtype

    avx2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}
    assert cpu_weight_dtype("auto", avx2)[0] == "float32"  # bfloat16 in software: 4x slower prefill
    assert cpu_weight_dtype("auto", avx2 | {"avx512f", "avx512_bf16"})[0] == "auto"
    assert cpu_weight_dtype("auto", avx2 | {"amx_bf16"})[0] == "auto"
    assert cpu_weight_dtype("auto", {"fp", "asimd", "bf16"})[0] == "auto"  # Arm
    assert cpu_weight_dtype("bfloat16", avx2) == ("bfloat16", "bfloat16, as configured")  # the operator decides


def test_generate_streams_deltas_then_done(engine_host):
    timing = engine_host.stats()["request_timing"]
    events = list(engine_host.generate(_request(max_tokens=24, priority=Priority.PREFILL, queue="prefill")))
    assert events[0].type == "admitted"
    assert events[0].data["kv_reservation_tokens"] == events[0].data["prompt_tokens"] + 24
    deltas = [e for e in events if e.type == "delta"]
    done = events[-1]
    assert done.type == "done"
    assert len(deltas) >= 2  # streamed, not delivered in one piece
    assert sum(e.data["tokens"] for e in deltas) == done.data["output_tokens"] <= 24
    assert "".join(e.data["text"] for e in deltas).strip()
    # vLLM's own timing of it is summed, as vllm serve's /metrics sums it (bench serving reads both).
    after = engine_host.stats()["request_timing"]
    assert after["requests_finished"] == timing["requests_finished"] + 1
    assert after["first_tokens"] == timing["first_tokens"] + 1
    assert after["prefill_s"] > timing["prefill_s"] and after["ttft_s"] > timing["ttft_s"]


def test_count_tokens_matches_the_admitted_prompt(engine_host):
    request = _request(max_tokens=8)
    counted = engine_host.count_tokens([request.messages])[0]
    admitted = next(iter(engine_host.generate(request)))
    assert admitted.type == "admitted" and admitted.data["prompt_tokens"] == counted


def test_a_prompt_longer_than_the_context_is_refused_with_a_reason(engine_host):
    huge = "word " * 20_000
    with pytest.raises(EngineRequestError) as error:
        list(engine_host.generate(_request(messages=[{"role": "user", "content": huge}])))
    assert error.value.code == "too_long"
    assert "context holds 8192" in error.value.detail


def test_disconnecting_aborts_the_request_and_frees_its_reservation(engine_host):
    stream = engine_host.generate(_request(max_tokens=2000))
    seen = 0
    for event in stream:
        if event.type == "delta":
            seen += 1
            if seen == 3:
                break
    stream.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = engine_host.stats()
        if stats["kv_reserved_tokens"] == 0 and stats["running"] == 0 and stats["requests_in_host"] == 0:
            break
        time.sleep(0.2)
    assert stats["kv_reserved_tokens"] == 0
    assert stats["admitted_requests"] == 0
    assert stats["requests_in_host"] == 0


def test_activity_tells_whether_drafting_runs_and_since_when_it_has_not(engine_host):
    """The cheap question the ingest's embedder asks several times a second: drafting requests
    in the host (a document's are not), and the seconds since the last one ended."""
    deadline = time.monotonic() + 30
    while engine_host.activity()["drafting_requests"] and time.monotonic() < deadline:
        time.sleep(0.1)  # an earlier test's draft, still leaving
    document = engine_host.generate(_request(max_tokens=400, priority=Priority.PREFILL, queue="prefill"))
    next(iter(document))  # admitted
    during_document = engine_host.activity()
    document.close()
    draft = engine_host.generate(_request(max_tokens=400))
    next(iter(draft))
    during = engine_host.activity()
    draft.close()
    deadline = time.monotonic() + 30
    while engine_host.activity()["drafting_requests"] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    after = engine_host.activity()
    assert during["drafting_requests"] == 1 and during["drafting_idle_s"] == 0
    assert during["device"] == engine_host.stats()["device"]
    assert after["drafting_requests"] == 0 and 0.3 <= after["drafting_idle_s"] < 30
    # The document alone counted no drafting (an earlier test's draft may have ended before).
    assert during_document["drafting_requests"] == 0 and during_document["drafting_idle_s"] != 0


def _document_request(tokens_of_text: int = 700, unique: str = "", **overrides) -> GenerateRequest:
    """A document job's request: a unique text (no prefix-cache hits from other tests)."""
    unique = unique or uuid.uuid4().hex
    body = " ".join(
        f"Clause {i} of contract {unique}: the supplier delivers the goods by Friday."
        for i in range(tokens_of_text // 20)
    )
    fields = {
        "messages": [{"role": "user", "content": f"<document>{body}</document>\nSummarise the document."}],
        "max_tokens": 8,
        "priority": Priority.PREFILL,
        "queue": "prefill",
    }
    fields.update(overrides)
    return _request(**fields)


def _document_of_tokens(engine_host, tokens: int, **overrides) -> GenerateRequest:
    """A document request whose prompt is about ``tokens`` tokens long (measured). One unique
    text throughout: a hex id's tokens vary from id to id, so a new id each try would never settle."""
    unique = uuid.uuid4().hex
    clauses = max(1, tokens // 25)
    for _ in range(4):
        request = _document_request(clauses * 20, unique=unique, **overrides)
        measured = engine_host.count_tokens([request.messages])[0]
        if abs(measured - tokens) <= tokens * 0.05:
            return request
        clauses = max(1, round(clauses * tokens / measured))
    return request


def _until_waiting(stream):
    for event in stream:
        yield event
        if event.type == "waiting":
            return


def _done(events):
    return next(e for e in events if e.type == "done")


def _scheduler(engine_host) -> dict:
    return engine_host.stats()["scheduler"]


def test_a_document_is_one_engine_request_and_a_second_read_hits_the_prefix_cache(engine_host):
    request = _document_request()
    first = _done(list(engine_host.generate(request)))
    assert first.data["cached_prompt_tokens"] == 0  # nobody read this text before
    block = engine_host.stats()["kv_block_size"]

    again = GenerateRequest(**{**request.__dict__, "request_id": f"test-{uuid.uuid4()}"})
    second = _done(list(engine_host.generate(again)))
    # The same document again: all of it but the last, partly filled block is in the cache.
    assert second.data["cached_prompt_tokens"] >= second.data["prompt_tokens"] - block


def test_requests_with_different_cache_salts_share_no_cached_block(engine_host):
    block = engine_host.stats()["kv_block_size"]
    request = _document_request(cache_salt="user-1")
    assert _done(list(engine_host.generate(request))).data["cached_prompt_tokens"] == 0
    other = replace(request, request_id=f"test-{uuid.uuid4()}", cache_salt="user-2")
    assert _done(list(engine_host.generate(other))).data["cached_prompt_tokens"] == 0  # the same text, salted
    unsalted = replace(request, request_id=f"test-{uuid.uuid4()}", cache_salt="")
    assert _done(list(engine_host.generate(unsalted))).data["cached_prompt_tokens"] == 0
    same = replace(request, request_id=f"test-{uuid.uuid4()}")
    done = _done(list(engine_host.generate(same)))
    assert done.data["cached_prompt_tokens"] >= done.data["prompt_tokens"] - block


def test_with_nobody_drafting_a_document_is_read_at_full_speed(engine_host):
    """Work-conserving: alone, a document's prompt is read in steps planned for nobody drafting,
    each as large as a 2 % loss of prefill speed allows by the step costs the engine measured
    (the prefill lane took one step per 128-token slice, and the steps beside drafting are a
    few dozen tokens on this CPU)."""
    from django.conf import settings

    from inference.engine.step_policy import Planner, PolicyConfig, RunningRequest, StepCostModel, WaitingRequest

    stats = engine_host.stats()
    request = _document_of_tokens(engine_host, 2500, max_tokens=4, ignore_eos=True)
    prompt_tokens = engine_host.count_tokens([request.messages])[0]
    cost = _scheduler(engine_host)["cost_model"]
    if not (cost.get("per_prefill_token_s") or cost.get("per_prefill_attention_s")):
        # Run alone, this module may reach here before the engine has read a long prompt: its
        # first documents-only steps calibrate the cost model (small steps, "calibrating").
        _done(list(engine_host.generate(_document_of_tokens(engine_host, 2000, max_tokens=1))))
    time.sleep(2.0)  # the host reads the scheduler's counters once a second: take them afresh
    scheduler_before = _scheduler(engine_host)
    before, cost_before = scheduler_before["counters"], scheduler_before["cost_model"]
    # The earlier tests' drafters were in the engine moments ago; nobody drafting means lately too.
    engine_host.set_scheduling(drafting_recent_s=0)
    try:
        done = _done(list(engine_host.generate(request)))
    finally:
        engine_host.set_scheduling(drafting_recent_s=settings.APPLIANCE_DRAFTING_RECENT_S)
    time.sleep(2.0)
    scheduler = _scheduler(engine_host)
    after = scheduler["counters"]
    steps = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("steps_"))
    assert done.data["output_tokens"] == 4
    planned = {k: after.get(k, 0) - before.get(k, 0) for k in ("steps_slow_start", "steps_no_drafting")}
    assert planned["steps_slow_start"] + planned["steps_no_drafting"] == steps  # planned as such
    assert planned["steps_slow_start"] >= 1  # it arrived at an empty engine: a slow start first
    cost = scheduler["cost_model"]
    assert cost["fitted"]

    # The steps the plan needs for this prompt by the engine's own figures: a slow start from a
    # drafter's first step, then the 2 % rule's chunks as they shrink with the attention over
    # what is read; 3 more wrote the rest of the answer.
    def steps_needed(cost: dict) -> int:
        planner = Planner(
            config=PolicyConfig(drafting_recent_s=0),
            max_budget_tokens=stats["max_num_batched_tokens"],
            cost=StepCostModel.from_coefficients(tuple(cost[k] for k in StepCostModel.FEATURES)),
            default_draft_prompt_tokens=scheduler["draft_prompt_tokens"],  # the earlier tests' drafters
        )
        plan = planner.plan([], [WaitingRequest("doc", drafting=False, user="")], ["doc"], set(), now=0.0)
        position, needed = 0, 0
        while position < prompt_tokens:
            position += plan.document_budget_tokens or stats["max_num_batched_tokens"]
            needed += 1
            left = max(0, prompt_tokens - position)
            running = RunningRequest("doc", drafting=False, user="", arrival=0.0, need_tokens=left,
                                     prefill_left=left, context_tokens=position)  # fmt: skip
            plan = planner.plan([running], [], [], set(), now=float(needed))
        return needed

    # The model refits as the document is read, so its chunks move between what the model said
    # as the document arrived and what it says after: the plan's steps by the more careful of
    # the two (and 2 more for the refits between them).
    needed = max(steps_needed(cost_before), steps_needed(cost))
    assert steps <= needed + 3 + 2, (steps, steps_needed(cost_before), steps_needed(cost))


def test_a_document_beside_a_streaming_drafter_progresses_in_the_steps_drafting_leaves(engine_host):
    """The prefill lane made a document wait until nobody drafted; the scheduler gives it what
    each step has left, so it finishes while the drafter is still writing. (The drafter may write
    far more than the document needs, and stops once the document is done: how long a fixed
    drafter takes next to a document depends on the machine, and a race on it failed CI once.)"""
    import threading

    drafter_events: list = []
    drafter_started = threading.Event()
    document_done_at: list[float] = []  # when the document's last event reached this process
    drafter_tokens = 3000

    def drafter():
        stream = engine_host.generate(_request(max_tokens=drafter_tokens, ignore_eos=True))
        try:
            for event in stream:
                drafter_events.append(event)
                if event.type == "delta":
                    drafter_started.set()
                # Stops once it has written something after the document was done.
                if document_done_at and event.received_at > document_done_at[0]:
                    break
        finally:
            stream.close()  # aborts the drafter in the engine

    before = _scheduler(engine_host)["counters"].get("steps_drafting_running", 0)
    thread = threading.Thread(target=drafter)
    thread.start()
    assert drafter_started.wait(120)
    # Alone, the drafter's steps are what drafters feel without documents: measured, they bound
    # a saved-up document chunk's step.
    felt = wait_until(lambda: _scheduler(engine_host).get("drafting_step_p95_ms"), timeout_s=120, interval_s=0.5,
                      message="drafters' steps alone measured")  # fmt: skip
    assert felt > 0
    read_before = sum(t["document_tokens"] for t in _scheduler(engine_host)["step_times"].values())
    document = _document_of_tokens(engine_host, 1500)
    prompt_tokens = engine_host.count_tokens([document.messages])[0]
    document_events = list(engine_host.generate(document))
    document_done_at.append(_done(document_events).received_at)
    thread.join(300)
    document_done = _done(document_events)
    # Not starved behind the drafter: done while it was still writing its 3000 tokens.
    assert all(e.type != "done" for e in drafter_events), "the drafter finished before the document"
    assert any(e.type == "delta" and e.received_at > document_done.received_at for e in drafter_events)
    # It may wait a moment to start (each waiting event is a second of it; with chunks saved up
    # beside drafting, APPLIANCE_CHUNK_FIXED_COST_SHARE, until one is), never for KV or for the
    # drafter to finish.
    waits = [e for e in document_events if e.type == "waiting"]
    assert len(waits) <= 3 and all(e.data.get("reason") != "kv_budget" for e in waits), waits
    snapshot = _scheduler(engine_host)
    assert snapshot["counters"].get("steps_drafting_running", 0) > before  # steps sized for drafting were planned
    timed = snapshot["step_times"]["drafting_running"]  # and their times measured
    assert timed["steps"] > 0 and 0 < timed["p50_ms"] <= timed["p95_ms"]
    # Over the cost model's prediction where it had one (a fresh engine's first steps have none).
    assert timed["p95_over_model"] is None or timed["p95_over_model"] > 0
    # The document's prompt tokens are counted in the steps that read them (the drafter's are
    # not): all of them but a prefix the cache may hold, and no more.
    read = sum(t["document_tokens"] for t in snapshot["step_times"].values()) - read_before
    assert prompt_tokens // 2 < read <= prompt_tokens, (read, prompt_tokens)


def test_a_drafter_that_arrives_while_a_document_prefills_starts_before_the_document(engine_host):
    """Under vLLM alone a document in mid-prefill takes each step's budget first, and a drafter
    that arrives behind it waits for the whole prefill; held back for a step, the document lets
    the drafter in at once. The drafter is sent while the document has a good part of its prompt
    left (a drafter sent in its last chunk's step needs nothing held, and the full suite's load
    once made that happen with a shorter document)."""
    import threading

    document_events: list = []
    prefilling = threading.Event()

    def document():
        for event in engine_host.generate(_document_of_tokens(engine_host, 5000, max_tokens=4)):
            document_events.append(event)
            done, total = event.data.get("tokens_done"), event.data.get("prompt_tokens")
            if event.type == "prefill" and done and total and total - done >= 1500:
                prefilling.set()

    held_before = _scheduler(engine_host)["counters"].get("held_document_steps", 0)
    thread = threading.Thread(target=document)
    thread.start()
    assert prefilling.wait(120), "the document never reported its prefill"
    drafter_events = list(engine_host.generate(_request(max_tokens=8, ignore_eos=True)))
    thread.join(300)
    drafter_first = next(e for e in drafter_events if e.type == "delta")
    document_first = next(e for e in document_events if e.type == "delta")
    assert drafter_first.received_at < document_first.received_at
    assert _scheduler(engine_host)["counters"].get("held_document_steps", 0) > held_before


def test_requests_sharing_a_prefix_reserve_its_blocks_once(engine_host):
    """Requests of one long prompt, each reserving prompt + max output: counted one by one they
    would overflow the KV budget; sharing the prompt's blocks, all of them run at once. (As many
    as overflow the budget this engine has: it is twice as large where the CPU computes in
    bfloat16 as where it falls back to float32.)"""
    import threading

    stats = engine_host.stats()
    budget, block = stats["kv_budget_tokens"], stats["kv_block_size"]
    shared = _document_of_tokens(engine_host, 3000)
    prompt_tokens = engine_host.count_tokens([shared.messages])[0]
    output = min(5000, stats["max_model_len"] - prompt_tokens - block)  # within the context
    n = budget // (prompt_tokens + output) + 1
    assert n * (prompt_tokens + output) > budget  # one by one, they would not fit
    assert prompt_tokens + n * (output + 2 * block) < 0.9 * budget  # sharing the prompt, they do
    assert n <= stats["max_num_seqs"]
    requests = [
        GenerateRequest(
            **{**shared.__dict__, "request_id": f"test-{uuid.uuid4()}", "max_tokens": output, "ignore_eos": True}
        )  # fmt: skip
        for _ in range(n)
    ]
    waited: list = []
    first_started = threading.Event()
    all_generating = threading.Barrier(n + 1)
    ended: dict = {}  # request id -> how its stream ended before its first token, if it did

    def one(request: GenerateRequest) -> None:
        stream = engine_host.generate(request)
        seen: list = []
        try:
            for event in stream:
                seen.append(event.type)
                if event.type == "waiting" and event.data.get("reason") == "kv_budget":
                    waited.append(request.request_id)
                if event.type == "delta":
                    first_started.set()
                    all_generating.wait(900)
                    return
            ended[request.request_id] = f"the stream ended before a token: {seen} {stream!r}"
        except threading.BrokenBarrierError:
            pass  # the test's clean-up
        except Exception as exc:  # noqa: BLE001 - said by the test, not swallowed
            ended[request.request_id] = f"{type(exc).__name__}: {exc} after {seen}"
        finally:
            stream.close()

    threads = [threading.Thread(target=one, args=(requests[0],))]
    threads[0].start()
    try:
        # Its prompt is computed (in the prefix cache for the others), or it ended, and says how.
        deadline = time.monotonic() + 900
        while not first_started.wait(1) and threads[0].is_alive() and time.monotonic() < deadline:
            pass
        assert first_started.is_set(), ended
        for request in requests[1:]:
            threads.append(threading.Thread(target=one, args=(request,)))
            threads[-1].start()
        all_generating.wait(900)  # all of them are generating at once
        assert waited == []
    finally:
        all_generating.abort()
        for request in requests:
            engine_host.abort(request.request_id)
        for thread in threads:
            thread.join(60)


def test_a_request_waits_in_the_engine_while_the_kv_budget_is_reserved(engine_host):
    import threading

    stats = engine_host.stats()
    output = 8000
    holders = [_request(max_tokens=output, ignore_eos=True) for _ in range(stats["kv_budget_tokens"] // (output + 200))]
    started = threading.Semaphore(0)
    finished = threading.Event()

    def hold(request: GenerateRequest) -> None:
        stream = engine_host.generate(request)
        try:
            for event in stream:
                if event.type == "delta":
                    started.release()
                    finished.wait(900)  # keep the request (its connection) until the test ends
                    return
        except Exception:  # noqa: S110 - aborted by the test's clean-up
            pass
        finally:
            stream.close()

    threads = [threading.Thread(target=hold, args=(request,)) for request in holders]
    for thread in threads:
        thread.start()
    late_request = _request(max_tokens=output, ignore_eos=True)
    try:
        for _ in holders:
            assert started.acquire(timeout=900)
        late = engine_host.generate(late_request)
        events = []
        for event in late:
            events.append(event)
            # The host's first report may come before the scheduler's next step has looked at the
            # request ("queued"); the step after says why it waits.
            if event.type == "waiting" and event.data["reason"] != "queued":
                break
        assert events[-1].type == "waiting" and events[-1].data["reason"] == "kv_budget"
        assert events[-1].data["position"] == 1
        assert engine_host.stats()["waiting_for_admission"] == 1
        engine_host.abort(holders[0].request_id)  # one holder leaves: its blocks are free
        for event in late:
            if event.type == "delta":
                break
        else:
            pytest.fail("the waiting request never started")
        late.close()
    finally:
        finished.set()
        for request in [*holders, late_request]:
            engine_host.abort(request.request_id)
        for thread in threads:
            thread.join(60)


def test_the_baseline_policies_leave_vllm_alone(engine_host):
    try:
        answer = engine_host.set_scheduling("engine", long_prefill_token_threshold=256)
        assert answer["scheduling"] == "engine" and answer["settings"]["long_prefill_token_threshold"] == 256
        assert engine_host.stats()["scheduling"] == "engine"
        events = list(engine_host.generate(_document_request()))
        assert events[0].data["kv_reservation_tokens"] == 0  # no admission control
        assert _done(events).data["output_tokens"] > 0
    finally:
        engine_host.set_scheduling("appliance", long_prefill_token_threshold=0)
    assert engine_host.stats()["scheduling"] == "appliance"
    with pytest.raises(EngineRequestError) as error:
        engine_host.set_scheduling("round-robin")
    assert error.value.code == "protocol"


def test_a_benchmark_can_make_the_predicted_reservation_learn_again(engine_host):
    """The predicted reservation learns from what recent drafts wrote (20 at least); a benchmark
    whose workload changes empties that history (``forget_output_lengths``)."""

    def predicted():
        return engine_host.stats()["scheduler"]["predicted_output_tokens"]["drafting"]

    def settles(want, timeout_s: float = 10.0):
        deadline = time.monotonic() + timeout_s
        while predicted() != want and time.monotonic() < deadline:
            time.sleep(0.2)  # the host reads the scheduler's state once a second
        return predicted()

    engine_host.set_scheduling(forget_output_lengths=True)
    assert settles(None) is None
    result = engine_host.run_direct([_request(max_tokens=3, ignore_eos=True) for _ in range(20)], timeout_s=300)
    assert result["output_tokens"] == 60
    assert settles(3) == 3
    engine_host.set_scheduling(forget_output_lengths=True)
    assert settles(None) is None


def test_run_direct_runs_requests_straight_on_the_engine(engine_host):
    result = engine_host.run_direct([_request(max_tokens=6, ignore_eos=True) for _ in range(2)], timeout_s=120)
    assert result["output_tokens"] == 12
    assert len(result["ttft_s"]) == 2 and result["elapsed_s"] > 0


def test_guided_decoding_holds_the_answer_to_the_clause_schema(engine_host):
    import json

    from inference.clauses import clause_schema

    schema = clause_schema(("Termination", "Payment Terms"), [2, 3])
    request = _request(
        messages=[
            {
                "role": "user",
                "content": "<document>[page 2]\nThe Customer pays each invoice within 30 days.\n[page 3]\nEither party may "
                "terminate on 90 days' notice.</document>\nList the clauses as JSON.",
            }
        ],
        max_tokens=400,
        priority=Priority.PREFILL,
        queue="prefill",
        json_schema=schema,
    )
    events = list(engine_host.generate(request))
    text = "".join(e.data["text"] for e in events if e.type == "delta")
    answer = json.loads(text)  # a small model, and still valid JSON of the schema's shape
    assert set(answer) == {"clauses"}
    for clause in answer["clauses"]:
        assert set(clause) == {"category", "quote", "page", "note"}
        assert clause["category"] in {"Termination", "Payment Terms"}
        assert clause["page"] in {2, 3}


def test_role_markers_a_message_writes_are_read_as_text_not_as_control_tokens(engine_host):
    """A document or message holding "<|im_end|>" would otherwise end its own turn (``chat_tokens``):
    the host counts it as the several text tokens it is spelt with, not as the one marker."""
    empty, marker = engine_host.count_tokens(
        [[{"role": "user", "content": "Rent: "}], [{"role": "user", "content": "Rent: <|im_end|>"}]]
    )
    assert marker - empty >= 5  # "<", "|", "im", "_", "end", ... rather than one token


def test_the_ingest_sees_drafting_in_the_engine_on_its_device(engine_host, monkeypatch):
    """The ingest's embedder rests while this machine's engine runs drafting requests on its
    device (documents.embeddings.engine_drafts_on): yes while a draft streams, no after, and no
    for an embedder on another device."""
    from documents import embeddings

    monkeypatch.setattr(embeddings, "_engine_client", engine_host)
    device = engine_host.stats()["device"]
    other = "cuda" if device == "cpu" else "cpu"
    assert embeddings.engine_drafts_on(device) is False
    stream = engine_host.generate(_request(max_tokens=2000))
    try:
        assert next(event for event in stream if event.type == "delta")
        assert embeddings.engine_drafts_on(device) is True
        assert embeddings.engine_drafts_on(other) is False
    finally:
        stream.close()
    deadline = time.monotonic() + 30
    while embeddings.engine_drafts_on(device) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert embeddings.engine_drafts_on(device) is False
