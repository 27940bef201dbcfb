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
