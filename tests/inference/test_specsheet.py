"""The spec sheet's arithmetic, answers and files (pure; the requests are fakes built here, with
arrival times chosen so that every figure is known)."""

from __future__ import annotations

import pytest

from inference.measure import specsheet
from inference.measure.specsheet import Sample, Targets
from inference.timing import Delta

TARGETS = Targets(ttft_ms=2000, itl_ms=100, min_goodput=0.9)


def fake_request(*, ttft_s: float, gap_s: float, tokens: int, kind: str = "drafting", per_delta: int = 1) -> Sample:
    """A request sent at t=100 whose first token arrives after ``ttft_s`` and the others
    ``gap_s`` apart, ``per_delta`` tokens to a delta."""
    sent = 100.0
    deltas = [Delta(at=sent + ttft_s, tokens=1)]
    at = sent + ttft_s
    written = 1
    while written < tokens:
        n = min(per_delta, tokens - written)
        at += gap_s * n
        deltas.append(Delta(at=at, tokens=n))
        written += n
    return Sample(kind=kind, sent_at=sent, deltas=deltas, finished_at=at, prompt_tokens=500)


def test_the_ladder_doubles_up_to_its_top():
    assert specsheet.ladder(1) == [1]
    assert specsheet.ladder(32) == [1, 2, 4, 8, 16, 32]
    assert specsheet.ladder(6) == [1, 2, 4, 6]


def test_a_level_reports_latency_rates_and_goodput():
    fast = [fake_request(ttft_s=0.5, gap_s=0.05, tokens=101) for _ in range(3)]
    slow_start = fake_request(ttft_s=3.0, gap_s=0.05, tokens=101)  # misses the TTFT target
    failed = Sample(kind="drafting", sent_at=100.0, error="the job failed: out of memory")
    row = specsheet.summarise_level([*fast, slow_start, failed], concurrency=5, wall_s=10.0, targets=TARGETS)

    assert row["requests"] == 5 and row["failed"] == 1
    assert row["errors"] == ["the job failed: out of memory"]
    assert row["ttft_p50_ms"] == 500.0
    assert row["ttft_p95_ms"] == pytest.approx(500 + 0.85 * 2500, abs=0.1)  # between 0.5 s and 3 s
    assert row["itl_p50_ms"] == 50.0 and row["itl_p95_ms"] == 50.0
    assert row["tokens_per_s_per_user"] == 20.0  # 100 tokens after the first, 5 s
    assert row["aggregate_tokens_per_s"] == 40.4  # 404 tokens in 10 s
    assert row["requests_per_s"] == 0.4
    assert row["goodput"] == 0.6  # 3 of 5 met the target
    assert row["meets_target"] is False
    assert row["output_tokens_mean"] == 101.0 and row["prompt_tokens_mean"] == 500.0


def test_batched_deltas_spread_their_gap_over_their_tokens():
    # The worker sends tokens in batches: 5 tokens 250 ms after the previous batch are 5 tokens
    # 50 ms apart, as the user reads them.
    batched = fake_request(ttft_s=0.2, gap_s=0.05, tokens=51, per_delta=5)
    row = specsheet.summarise_level([batched], concurrency=1, wall_s=3.0, targets=TARGETS)
    assert row["itl_p50_ms"] == pytest.approx(50.0)
    assert row["tokens_per_s_per_user"] == pytest.approx(20.0)


def test_a_slow_decode_misses_the_target_even_with_a_fast_first_token():
    slow = fake_request(ttft_s=0.1, gap_s=0.15, tokens=20)
    assert not slow.meets(TARGETS)
    assert fake_request(ttft_s=0.1, gap_s=0.05, tokens=20).meets(TARGETS)
    assert fake_request(ttft_s=1.9, gap_s=0.0999, tokens=2).meets(TARGETS)


def test_users_served_is_the_top_of_the_unbroken_run_of_passing_levels():
    def level(n: int, ok: bool) -> dict:
        return {"concurrency": n, "meets_target": ok}

    assert specsheet.users_served([level(1, True), level(2, True), level(4, False)]) == 2
    assert specsheet.users_served([level(1, False), level(2, True)]) == 0  # a lucky level above a failure
    assert specsheet.users_served([]) == 0


def test_the_decode_ceiling_is_bandwidth_over_the_bytes_one_step_reads():
    # Llama-3.1-8B in bf16 on 3.35 TB/s (an H100 SXM): 16.06 GB of weights + 128 KiB x 1,000
    # tokens of KV cache a step: about 207 tokens/s for one user at most.
    ceiling = specsheet.decode_ceiling(
        bandwidth_bytes_per_s=3.35e12,
        weight_bytes=16_060_000_000,
        kv_bytes_per_token=131_072,
        context_tokens=1000,
        measured_tokens_per_s=150.0,
    )
    assert ceiling["bytes_per_step"] == 16_060_000_000 + 131_072_000
    assert ceiling["ceiling_tokens_per_s"] == pytest.approx(3.35e12 / 16_191_072_000, abs=0.01)
    assert ceiling["share_of_ceiling"] == pytest.approx(150 / (3.35e12 / 16_191_072_000), abs=0.001)
    unknown = specsheet.decode_ceiling(
        bandwidth_bytes_per_s=None, weight_bytes=1, kv_bytes_per_token=1, context_tokens=1, measured_tokens_per_s=10
    )
    assert unknown["ceiling_tokens_per_s"] is None and unknown["share_of_ceiling"] is None


def sample_sheet() -> dict:
    def profile(label: str, kinds: dict, levels: list[dict], served: int, stopped: str) -> dict:
        single = len(kinds) == 1
        return {
            "label": label,
            "description": f"{label} workload",
            "input_tokens": next(iter(kinds.values()))[0] if single else None,
            "output_tokens": next(iter(kinds.values()))[1] if single else None,
            "inputs": {k: v[0] for k, v in kinds.items()},
            "outputs": {k: v[1] for k, v in kinds.items()},
            "requests_per_user": 2,
            "levels": levels,
            "users_served": served,
            "stopped": stopped,
        }

    drafting_rows = [
        specsheet.summarise_level(
            [fake_request(ttft_s=0.3 * n, gap_s=0.03 * n, tokens=500) for _ in range(2 * n)],
            concurrency=n,
            wall_s=20.0 * n,
            targets=TARGETS,
        )
        for n in (1, 2, 4)
    ]
    document_rows = [
        specsheet.summarise_level(
            [fake_request(ttft_s=12.0, gap_s=0.04, tokens=256, kind="document")] * 2,
            concurrency=1,
            wall_s=40.0,
            targets=TARGETS,
        )
    ]
    return {
        "version": specsheet.SHEET_VERSION,
        "started_at": "2026-11-30T08:00:00+00:00",
        "duration_s": 300.0,
        "quick": False,
        "targets": {"ttft_ms": 2000.0, "itl_ms": 100.0, "min_goodput": 0.9},
        "model": {"name": "SmolLM2-135M-Instruct", "licence": "Apache-2.0"},
        "engine": {"dtype": "bfloat16", "kv_cache_dtype": "fp8", "max_model_len": 8192, "kv_capacity_tokens": 93184},
        "appliance": {"prefill_concurrency": 2, "decode_concurrency": 8},
        "hardware": {"device": "cpu", "cpu": "AMD EPYC", "cpus": 2, "ram_bytes": 24 * 1024**3, "vllm": "0.32.0"},
        "profiles": {
            "document": profile("Document", {"document": (6144, 256)}, document_rows, 0, "the latency target"),
            "drafting": profile("Drafting", {"drafting": (500, 500)}, drafting_rows, 2, "the latency target"),
            "mixed": profile("Mixed", {"document": (6144, 256), "drafting": (500, 500)}, [], 0, ""),
        },
        "decode_ceiling": {
            **specsheet.decode_ceiling(
                bandwidth_bytes_per_s=25e9,
                weight_bytes=269_030_016,
                kv_bytes_per_token=23_040,
                context_tokens=750,
                measured_tokens_per_s=drafting_rows[0]["tokens_per_s_per_user"],
            ),
            "bandwidth_source": "measured",
        },
    }


def test_the_eight_answers_come_from_the_measurements():
    sheet = sample_sheet()
    answers = specsheet.answers(sheet)
    assert [a["key"] for a in answers] == [
        "model", "precision", "context", "users", "lengths", "tokens_per_s", "ttft", "hardware",
    ]  # fmt: skip
    text = {a["key"]: a["answer"] for a in answers}
    assert text["model"] == "SmolLM2-135M-Instruct, licence Apache-2.0"
    assert text["precision"] == "weights bfloat16, KV cache fp8"
    assert "8,192 tokens configured" in text["context"] and "93,184" in text["context"]
    assert text["users"].startswith("document: 0 (stopped by the latency target); drafting: 2 (")
    assert "mixed" not in text["users"]  # not measured, so not claimed
    assert "6,144 in / 256 out" in text["lengths"] and "500 in / 500 out" in text["lengths"]
    # One user drafts at 1 / 30 ms; two at 1 / 60 ms: both levels are quoted.
    assert "drafting: 33.3 tokens/s at 1 user, 16.7 tokens/s at 2 users" in text["tokens_per_s"]
    assert "document: 12.00 s (p95 12.00 s) at 1 user" in text["ttft"]
    assert text["hardware"].startswith("no GPU: the model runs on the CPU (AMD EPYC, 2 cores, 24.0 GiB RAM)")


def test_a_gpu_is_named_with_its_memory_driver_and_versions():
    line = specsheet.hardware_line(
        {
            "device": "cuda", "device_name": "NVIDIA L40S", "device_count": 1, "device_memory_bytes": 48 * 1024**3,
            "cpu": "Intel Xeon", "cpus": 32, "ram_bytes": 256 * 1024**3, "driver": "580.65", "cuda": "12.8",
            "vllm": "0.11.0", "torch": "2.8.0",
        }
    )  # fmt: skip
    assert line == (
        "NVIDIA L40S (48.0 GiB); host Intel Xeon, 32 cores, 256.0 GiB RAM; driver 580.65, CUDA 12.8; "
        "vLLM 0.11.0, torch 2.8.0"
    )


def test_markdown_and_charts(tmp_path):
    sheet = sample_sheet()
    sheet["answers"] = specsheet.answers(sheet)
    sheet["charts"] = {"ttft": "t.png", "tokens_per_s": "s.png"}
    specsheet.draw_charts(sheet, ttft_path=tmp_path / "t.png", tokens_path=tmp_path / "s.png")
    for name in ("t.png", "s.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / name).stat().st_size > 10_000  # axes, lines and labels, not an empty canvas

    text = specsheet.markdown(sheet)
    for answer in sheet["answers"]:
        assert f"**{answer['question']}** {answer['answer']}." in text
    assert "**Users served: 2** (stopped by the latency target)" in text
    assert "| 4 | 8 | 0 | 1.20 s | 1.20 s | 120.0 ms | 120.0 ms | 8.3 |" in text  # 4 users: 30 ms x 4
    assert "Tokens: document 6,144 in / 256 out and drafting 500 in / 500 out" in text
    assert "![TTFT against concurrency](t.png)" in text
    assert "smoke test" not in text
    sheet["quick"] = True
    assert "A quick sheet is a smoke test, not figures to quote." in specsheet.markdown(sheet)
