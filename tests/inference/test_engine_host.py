"""The engine host with the real model: stats, streaming, priorities accepted, abort on disconnect."""

from __future__ import annotations

import time
import uuid

import pytest

from inference.engine.client import EngineRequestError
from inference.engine.protocol import GenerateRequest, Priority

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
    assert stats["model"] == "SmolLM2-135M-Instruct"
    assert stats["licence"] == "Apache-2.0"
    assert stats["dtype"] in {"bfloat16", "float32", "float16"}
    assert stats["kv_cache_dtype"] in {"bfloat16", "float32", "float16"}  # "auto" is resolved
    assert stats["max_model_len"] == 8192
    assert stats["kv_capacity_tokens"] > 8192  # 1 GiB of KV holds several full contexts of this model
    assert stats["kv_budget_tokens"] < stats["kv_capacity_tokens"]  # the safety factor
    for key in ("running", "waiting", "kv_usage", "prefix_cache_hit_rate", "preemptions", "vllm_version", "device"):
        assert key in stats


def test_generate_streams_deltas_then_done(engine_host):
    events = list(engine_host.generate(_request(max_tokens=24, priority=Priority.PREFILL, queue="prefill")))
    assert events[0].type == "admitted"
    assert events[0].data["kv_reservation_tokens"] == events[0].data["prompt_tokens"] + 24
    deltas = [e for e in events if e.type == "delta"]
    done = events[-1]
    assert done.type == "done"
    assert len(deltas) >= 2  # streamed, not delivered in one piece
    assert sum(e.data["tokens"] for e in deltas) == done.data["output_tokens"] <= 24
    assert "".join(e.data["text"] for e in deltas).strip()


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
        if stats["kv_reserved_tokens"] == 0 and stats["running"] == 0:
            break
        time.sleep(0.2)
    assert stats["kv_reserved_tokens"] == 0
    assert stats["admitted_requests"] == 0


def _document_request(tokens_of_text: int = 700, **overrides) -> GenerateRequest:
    """A document job's request: a unique text (no prefix-cache hits from other tests)."""
    unique = uuid.uuid4().hex
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


def _until_waiting(stream):
    for event in stream:
        yield event
        if event.type == "waiting":
            return


def _done(events):
    return next(e for e in events if e.type == "done")


def test_documents_prefill_in_slices_and_a_second_read_hits_the_prefix_cache(engine_host):
    request = _document_request()
    first = _done(list(engine_host.generate(request)))
    slice_tokens = engine_host.stats()["prefill_slice_tokens"]
    assert first.data["prompt_tokens"] > 3 * slice_tokens
    assert first.data["prefill_slices"] == (first.data["prompt_tokens"] - 2) // slice_tokens
    assert first.data["cached_prompt_tokens"] == 0  # nobody read this text before

    again = GenerateRequest(**{**request.__dict__, "request_id": f"test-{uuid.uuid4()}"})
    second = _done(list(engine_host.generate(again)))
    # The same document again: found in the prefix cache, and the slices grew while they hit it.
    assert second.data["cached_prompt_tokens"] >= second.data["prompt_tokens"] - slice_tokens
    assert second.data["prefill_slices"] < first.data["prefill_slices"]


def test_a_document_waits_for_its_prefill_turn_while_a_drafter_streams(engine_host):
    import threading

    drafter_events: list = []
    drafter_started = threading.Event()

    def drafter():
        for event in engine_host.generate(_request(max_tokens=96, ignore_eos=True)):
            drafter_events.append(event)
            if event.type == "delta":
                drafter_started.set()

    thread = threading.Thread(target=drafter)
    thread.start()
    assert drafter_started.wait(60)
    document_events = list(engine_host.generate(_document_request()))
    thread.join(60)
    drafter_done = _done(drafter_events)
    waiting = [e for e in document_events if e.type == "waiting"]
    first_document_token = next(e for e in document_events if e.type == "delta")
    assert waiting and waiting[0].data["reason"] == "prefill_lane"
    # Not one token of the document before the drafter finished: its prefill waited.
    assert first_document_token.received_at >= drafter_done.received_at
    assert drafter_done.data["output_tokens"] == 96


def test_leaving_while_waiting_for_a_prefill_turn_gives_everything_back(engine_host):
    import threading

    drafter_started = threading.Event()

    def drafter():
        for event in engine_host.generate(_request(max_tokens=150, ignore_eos=True)):
            if event.type == "delta":
                drafter_started.set()

    thread = threading.Thread(target=drafter)
    thread.start()
    assert drafter_started.wait(60)
    stream = engine_host.generate(_document_request())
    seen = [event.type for event in _until_waiting(stream)]
    stream.close()  # cancelled while it waits
    assert seen[-1] == "waiting" and "delta" not in seen
    thread.join(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = engine_host.stats()
        if stats["kv_reserved_tokens"] == 0 and stats["prefill_lane_waiting"] == 0 and stats["running"] == 0:
            break
        time.sleep(0.2)
    assert stats["kv_reserved_tokens"] == 0
    assert stats["prefill_lane_waiting"] == 0
    assert stats["drafting_requests"] == 0


def test_the_baseline_policies_skip_admission_and_the_lane(engine_host):
    try:
        assert engine_host.set_scheduling("engine") == "engine"
        assert engine_host.stats()["scheduling"] == "engine"
        events = list(engine_host.generate(_document_request()))
        assert events[0].data["kv_reservation_tokens"] == 0  # no admission control
        assert _done(events).data["prefill_slices"] == 0  # the whole prompt at once
    finally:
        engine_host.set_scheduling("appliance")
    assert engine_host.stats()["scheduling"] == "appliance"
    with pytest.raises(EngineRequestError) as error:
        engine_host.set_scheduling("round-robin")
    assert error.value.code == "protocol"


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
