"""The spec sheet's arithmetic, answers and files (pure; the requests are fakes built here, with
arrival times chosen so that every figure is known)."""

from __future__ import annotations

import pytest

from inference import specsheet
from inference.specsheet import Sample, Targets
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
    return Sample(
        kind=kind, sent_at=sent, deltas=deltas, first_token_at=sent + ttft_s, finished_at=at, prompt_tokens=500
    )


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
    assert specsheet.users_served([]) is None  # not measured is not "serves nobody"


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
    assert "mixed: not measured" in text["users"]  # not claimed as 0
    assert "6,144 in / 256 out" in text["lengths"] and "500 in / 500 out" in text["lengths"]
    # One user drafts at 1 / 30 ms; two at 1 / 60 ms: both levels are quoted.
    assert "drafting: 33.3 tokens/s at 1 user, 16.7 tokens/s at 2 users" in text["tokens_per_s"]
    assert "document: 12.00 s (p95 12.00 s) at 1 user" in text["ttft"]
    assert text["hardware"].startswith("no GPU: the model runs on the CPU (AMD EPYC, 2 cores, 24.0 GiB RAM)")


def test_the_sheet_says_which_figures_are_per_engine_and_which_for_the_cluster():
    sheet = sample_sheet()
    alone = specsheet.markdown({**sheet, "answers": specsheet.answers(sheet)})
    assert "measured on one engine; this deployment: 1 node, 1 engine" in alone
    assert "every figure is the whole deployment's" in alone
    sheet["topology"] = {"gpus_per_engine": 2, "engines_per_node": 2, "nodes": 3, "engines": 6}
    answers = {a["key"]: a["answer"] for a in specsheet.answers(sheet)}
    assert "93,184 tokens in all per engine, 559,104 on the cluster's 6 engines" in answers["context"]
    assert "per engine; target" in answers["users"]
    assert answers["hardware"].endswith(
        "measured on one engine of 2 GPUs (tensor parallel); this deployment: 3 nodes, 6 engines (2 per node)"
    )
    text = specsheet.markdown({**sheet, "answers": specsheet.answers(sheet)})
    assert "## Topology" in text and "the KV cache holds 559,104 tokens on 6 engines" in text
    assert "6 x the per-engine figures" in text and "bench cluster" in text


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


def test_the_ttft_is_the_clients_and_the_itl_the_workers():
    # The first token reached the worker at 100.2 s and the client at 100.35 s (the last hop):
    # the user felt 350 ms. The tokens' gaps are the worker's, not the 100 ms batches'.
    sample = Sample(
        kind="drafting",
        sent_at=100.0,
        deltas=[Delta(100.2, 1), Delta(100.23, 1), Delta(100.26, 1), Delta(100.76, 1)],
        first_token_at=100.35,
        finished_at=100.9,
    )
    assert sample.ttft_ms == pytest.approx(350)
    row = specsheet.summarise_level([sample], concurrency=1, wall_s=1.0, targets=TARGETS)
    assert row["itl_p50_ms"] == pytest.approx(30) and row["itl_p95_ms"] == pytest.approx(
        30 + 0.9 * 470
    )  # gaps 30, 30, 500


def test_stream_deltas_and_restarts_are_counted_from_the_workers_times():
    from measure.specsheet_run.client import _add_tokens, _restarted

    sample = Sample(kind="document", sent_at=10.0)
    _add_tokens(sample, {"text": "Dear", "tokens": 1, "times": [[10.5, 1]], "prompt_tokens": 900}, arrived=10.6)
    _add_tokens(sample, {"text": " Sir,", "tokens": 3, "times": [[10.55, 2], [10.58, 1]]}, arrived=10.7)
    assert sample.first_token_at == 10.6 and sample.prompt_tokens == 900
    assert [(d.at, d.tokens) for d in sample.deltas] == [(10.5, 1), (10.55, 2), (10.58, 1)]
    _restarted(sample)  # the worker was lost: the answer is written again from the start
    _add_tokens(sample, {"text": "Dear", "tokens": 1, "times": [[12.0, 1]]}, arrived=12.1)
    assert sample.restarts == 1 and [(d.at, d.tokens) for d in sample.deltas] == [(12.0, 1)]
    assert sample.first_token_at == 10.6  # what the user saw first stays first
    # A stream that does not say when its tokens came: the client's clock.
    plain = Sample(kind="drafting", sent_at=0.0)
    _add_tokens(plain, {"tokens": 2}, arrived=1.5)
    assert [(d.at, d.tokens) for d in plain.deltas] == [(1.5, 2)]


def test_the_kv_budget_counts_what_can_be_in_flight_at_once():
    def shortfall(documents: int, drafts: int) -> str | None:
        return specsheet.kv_shortfall(
            requests={"document": documents, "drafting": drafts},
            tokens_per_request={"document": 6_900, "drafting": 1_000},
            in_flight_cap={"document": 2, "drafting": 8},
            budget_tokens=22_000,
            document_budget_tokens=18_000,
        )

    assert shortfall(2, 0) is None
    assert shortfall(16, 0) is None  # 14 of them wait in the prefill queue, holding no KV cache
    assert shortfall(2, 16) is None  # 13,800 + 8 x 1,000
    too_many = specsheet.kv_shortfall(
        requests={"document": 3}, tokens_per_request={"document": 6_900}, in_flight_cap={"document": 4},
        budget_tokens=20_000, document_budget_tokens=18_000,
    )  # fmt: skip
    assert too_many == "3 document requests at once need 20,700 tokens of KV cache; documents may use 18,000"
    mixed = specsheet.kv_shortfall(
        requests={"document": 2, "drafting": 8}, tokens_per_request={"document": 6_900, "drafting": 1_000},
        in_flight_cap={"document": 2, "drafting": 8}, budget_tokens=20_000, document_budget_tokens=18_000,
    )  # fmt: skip
    assert mixed == "10 requests at once need 21,800 tokens of KV cache; the admission budget is 20,000"


class FakeLevels:
    """A fake of the workload's one level of requests: it records which levels were asked for
    and answers a row that meets the target up to ``passes`` users."""

    def __init__(self, passes: int) -> None:
        self.passes, self.ran = passes, []

    def __call__(self, name: str, kinds: list[str]) -> dict:
        self.ran.append(len(kinds))
        slow_start = 0.5 if len(kinds) <= self.passes else 3.0  # half the requests miss the TTFT target
        samples = [
            fake_request(ttft_s=0.5, gap_s=0.03, tokens=50),
            fake_request(ttft_s=slow_start, gap_s=0.03, tokens=50),
        ]
        return specsheet.summarise_level(samples, concurrency=len(kinds), wall_s=5.0, targets=TARGETS)


def ladder_workload(*, passes: int, budget: int = 10**6, levels=None, deadline_s: float = 3600.0):
    import time
    from types import SimpleNamespace

    from measure.specsheet_run.workload import _Workload

    workload = _Workload.__new__(_Workload)
    workload.plan = SimpleNamespace(
        levels=levels, max_concurrency=32, requests_per_user=2, targets=TARGETS,
        deadline=time.monotonic() + deadline_s, document_output=256, drafting_output=500,
    )  # fmt: skip
    workload.engine = {"max_num_seqs": 32}
    workload.document_input, workload.drafting_input = 6_656, 500
    workload.kv_budget, workload.kv_decode_reserve = budget, budget // 10
    workload.progress = lambda message: None
    workload._level = FakeLevels(passes)
    return workload


@pytest.mark.django_db
def test_the_ladder_stops_at_the_first_level_that_misses_the_target():
    workload = ladder_workload(passes=2)
    profile = workload.profile("drafting")
    assert workload._level.ran == [1, 2, 4]  # 8 is not tried once 4 misses
    assert profile["users_served"] == 2
    assert profile["stopped"] == "the latency target: goodput 50% < 90% at 4 users"


@pytest.mark.django_db
def test_the_ladder_stops_before_a_level_the_kv_budget_cannot_hold(settings):
    settings.APPLIANCE_DECODE_CONCURRENCY = 32  # every drafter in flight at once
    workload = ladder_workload(passes=32, budget=3_500)  # 1,000 tokens a drafting request
    profile = workload.profile("drafting")
    assert workload._level.ran == [1, 2]
    assert profile["users_served"] == 2
    assert profile["stopped"].startswith("the KV budget at 4 users: 4 requests at once need 4,000 tokens")


@pytest.mark.django_db
def test_explicit_levels_all_run_and_a_spent_time_budget_measures_nothing():
    workload = ladder_workload(passes=1, levels=[1, 2, 4])
    assert workload.profile("drafting")["users_served"] == 1 and workload._level.ran == [1, 2, 4]
    late = ladder_workload(passes=32, deadline_s=-1)
    profile = late.profile("document")
    assert late._level.ran == [] and profile["users_served"] is None
    assert profile["stopped"] == "the time budget (--max-minutes) ran out"
    mixed = ladder_workload(passes=32, levels=[1, 2]).profile("mixed")
    assert [row["concurrency"] for row in mixed["levels"]] == [2]  # a mix needs two users


def test_chat_chunks_count_their_tokens_and_notice_a_restart():
    from measure.specsheet_run.client import _chat_chunk

    def chunk(text: str, so_far: int, times: list | None) -> dict:
        body = {"choices": [{"delta": {"content": text}}], "usage": {"prompt_tokens": 40, "completion_tokens": so_far}}
        if times is not None:
            body["appliance"] = {"token_times": times}
        return body

    sample = Sample(kind="drafting", sent_at=0.0)
    written = _chat_chunk(sample, {"choices": [{"delta": {"role": "assistant"}}]}, 0, arrived=0.1)  # no usage yet
    written = _chat_chunk(sample, chunk("Dear", 1, [[0.5, 1]]), written, arrived=0.6)
    written = _chat_chunk(sample, chunk(" Sir,", 3, [[0.53, 1], [0.56, 1]]), written, arrived=0.7)
    assert written == 3 and sample.restarts == 0 and sum(d.tokens for d in sample.deltas) == 3
    # Restarted: the new attempt's chunk comes once it has caught up, with all its tokens' times.
    written = _chat_chunk(sample, chunk(" thank", 4, [[2.0, 1], [2.03, 1], [2.06, 1], [2.09, 1]]), written, arrived=2.1)
    assert sample.restarts == 1 and [d.at for d in sample.deltas] == [2.0, 2.03, 2.06, 2.09]
    assert sample.first_token_at == 0.6 and sample.prompt_tokens == 40
    # A server that does not send the times: the usage's growth, at the client's clock.
    plain = Sample(kind="drafting", sent_at=0.0)
    written = _chat_chunk(plain, chunk("Dear", 2, None), 0, arrived=0.4)
    written = _chat_chunk(plain, chunk(" Sir", 5, None), written, arrived=0.5)
    assert [(d.at, d.tokens) for d in plain.deltas] == [(0.4, 2), (0.5, 3)] and plain.restarts == 0
