"""``manage.py bench serving`` (``measure/bench_serving.py``): reading vLLM's bench
results, the ratios and their verdicts, and the command lines that make the comparison fair.
Pure: no server is started (the command itself is the measurement)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from inference.engine import vllm_cli
from measure import bench_serving


def _result(*, tokens_per_s=100.0, ttft=500.0, itl_p99=50.0, tpot=40.0, itl_p50=38.0, failed=0, **extra) -> dict:
    """A ``vllm bench serve --save-result --save-detailed`` result, as vLLM 0.32 writes it."""
    return {
        "completed": 4 - failed,
        "failed": failed,
        "duration": 5.12,
        "total_output_tokens": 12,
        "output_throughput": tokens_per_s,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "p99_itl_ms": itl_p99,
        "median_tpot_ms": tpot,
        "median_itl_ms": itl_p50,
        "output_lens": [4, 4, 4, 0],
        "itls": [[0.1, 0.1, 0.1], [0.2], [0.1], []],
        "errors": ["", "", "", ""],
        **extra,
    }


def test_the_figures_of_a_bench_result_and_how_many_tokens_a_chunk_carried():
    figures = bench_serving.bench_figures(_result())
    assert figures["output_tokens_per_s"] == 100.0 and figures["ttft_p50_ms"] == 500.0
    assert (figures["itl_p99_ms"], figures["tpot_p50_ms"], figures["itl_p50_ms"]) == (50.0, 40.0, 38.0)
    assert (figures["completed"], figures["failed"], figures["output_tokens"]) == (4, 0, 12)
    # 12 tokens in 4 + 2 + 2 chunks (a request that wrote nothing has no chunk).
    assert figures["tokens_per_chunk"] == 1.5
    assert "first_error" not in figures
    failed = bench_serving.bench_figures(_result(failed=1, errors=["", "Traceback ...\nClientPayloadError: broken"]))
    assert failed["failed"] == 1 and failed["first_error"] == "ClientPayloadError: broken"


def test_ratios_are_the_appliance_over_vllm_within_a_repeat_and_none_when_a_side_failed():
    appliance = bench_serving.bench_figures(_result(tokens_per_s=95.0, ttft=600.0, itl_p99=100.0))
    vllm = bench_serving.bench_figures(_result())
    ratios = bench_serving.ratios(appliance, vllm)
    assert ratios == {
        "output_tokens_per_s": 0.95,
        "ttft_p50_ms": 1.2,
        "itl_p99_ms": 2.0,
        "tpot_p50_ms": 1.0,
        "itl_p50_ms": 1.0,
    }
    broken = bench_serving.bench_figures(_result(failed=1))
    assert set(bench_serving.ratios(broken, vllm).values()) == {None}
    assert set(bench_serving.ratios(vllm, broken).values()) == {None}


def _repeat(appliance: dict, vllm: dict) -> dict:
    return {
        "order": ["appliance", "vllm"],
        "appliance": appliance,
        "vllm": vllm,
        "ratios": bench_serving.ratios(appliance, vllm),
        "load_average": (1.0, 1.0, 1.0),
    }


def test_each_ratio_is_a_mean_with_an_interval_against_its_target():
    vllm = bench_serving.bench_figures(_result())
    repeats = [
        _repeat(bench_serving.bench_figures(_result(tokens_per_s=t, ttft=f, itl_p99=i)), vllm)
        for t, f, i in [(99.0, 600.0, 200.0), (99.5, 620.0, 210.0), (99.2, 610.0, 190.0)]
    ]
    summary = bench_serving.summarise(repeats)
    throughput = summary["output_tokens_per_s"]
    assert throughput["ratio"]["n"] == 3 and throughput["ratio"]["mean"] == pytest.approx(0.9923, abs=1e-3)
    assert throughput["target"] == ">= 0.98x" and throughput["verdict"] == "met"
    assert summary["ttft_p50_ms"]["verdict"] == "met"  # 1.2x against <= 1.5x
    assert summary["itl_p99_ms"]["verdict"] == "missed"  # 2x against <= 1.5x
    assert "verdict" not in summary["tpot_p50_ms"] and summary["tpot_p50_ms"]["ratio"]["mean"] == 1.0
    assert summary["ttft_p50_ms"]["appliance"]["mean"] == 610.0 and summary["ttft_p50_ms"]["vllm"]["mean"] == 500.0
    # A repeat whose requests failed has no ratios: it does not count, and says so.
    repeats.append(_repeat(bench_serving.bench_figures(_result(failed=2)), vllm))
    assert bench_serving.summarise(repeats)["output_tokens_per_s"]["ratio"]["n"] == 3
    repeats[0]["appliance"]["cpu_s_per_1k_tokens"] = {"the engine host": 50.0, "the web server": 1.5}
    results = {
        "parameters": {"num_prompts": 4, "input_len": 256, "output_len": 128, "concurrency": 2},
        "engine": {"model": "SmolLM2-135M-Instruct", "device_name": "x86_64"},
        "repeats": repeats,
        "summary": bench_serving.summarise(repeats),
    }
    lines = bench_serving.table(results)
    row = next(line for line in lines if line.startswith("ITL p99 (ms)"))
    assert "200" in row and "50" in row and "<= 1.5x" in row and row.endswith("missed")
    assert any(line.startswith("repeat 4") and "2 failed" in line for line in lines)
    assert any(line.startswith("repeat 1") and "engine host 50 + web server 1.5" in line for line in lines)


def test_the_appliances_own_ttft_is_split_into_its_parts_and_shown_under_its_repeat():
    rows = [
        {"queue_wait_ms": 10.0, "admission_wait_ms": 1.0, "prefill_ms": 100.0, "ttft_ms": 131.0},
        {"queue_wait_ms": 30.0, "admission_wait_ms": 3.0, "prefill_ms": 300.0, "ttft_ms": 733.0},
        {"queue_wait_ms": 20.0, "admission_wait_ms": 2.0, "prefill_ms": 200.0, "ttft_ms": 242.0},
        {"queue_wait_ms": 5.0, "admission_wait_ms": 0.0, "prefill_ms": None, "ttft_ms": None},  # no token came
    ]
    parts = bench_serving.ttft_parts(rows)
    assert parts["requests"] == 3
    assert parts["queue"]["p50"] == 20.0 and parts["prefill"]["p50"] == 200.0 and parts["ttft"]["p50"] == 242.0
    assert parts["setup"]["p50"] == 20.0  # 20, 20 and 400 ms between the worker's start and the engine
    assert parts["setup"]["p95"] == pytest.approx(362.0)
    assert bench_serving.ttft_parts(rows[3:]) is None
    vllm = bench_serving.bench_figures(_result())
    appliance = bench_serving.bench_figures(_result(ttft=260.0)) | {"ttft_parts_ms": parts}
    line = _table_line(appliance, vllm, "appliance TTFT")
    assert "queue 20 / 29" in line and "setup 20 / 362" in line and "3 requests" in line and "p50 260 ms" in line


def _table_line(appliance: dict, vllm: dict, marker: str) -> str:
    """The line of ``bench_serving.table`` holding ``marker``, for one repeat of these figures."""
    results = {
        "parameters": {"num_prompts": 4, "input_len": 256, "output_len": 128, "concurrency": 2},
        "engine": {},
        "repeats": [_repeat(appliance, vllm)],
        "summary": bench_serving.summarise([_repeat(appliance, vllm)]),
    }
    return next(line for line in bench_serving.table(results) if marker in line)


# A fragment of vllm serve's /metrics as vLLM 0.32 writes it (two label sets of one histogram).
METRICS_TEXT = """\
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 9.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.25
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 9.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.05
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 1.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 4.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 5.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 11.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="m"} 999.0
"""


def test_vllms_own_request_timing_is_read_alike_from_both_servers_and_shown_per_repeat():
    totals = bench_serving.prometheus_timing(METRICS_TEXT)
    assert totals == {
        "queue_s": pytest.approx(0.30), "requests_finished": 10.0, "prefill_s": 4.0, "first_tokens": 11.0, "ttft_s": 5.5,
    }  # fmt: skip
    before = {"requests_finished": 4, "queue_s": 0.1, "prefill_s": 1.0, "first_tokens": 5, "ttft_s": 2.5}
    means = bench_serving.engine_timing(before, totals)
    # 6 requests: 0.2 s queued and 3 s scheduled -> first token between them; 6 first tokens in 3 s.
    assert means == {"queue": pytest.approx(33.3), "prefill": 500.0, "ttft": 500.0, "requests": 6}
    assert bench_serving.engine_timing(None, totals) is None  # a server that could not be read
    assert bench_serving.engine_timing(totals, totals)["prefill"] is None  # no request between
    went_back = bench_serving.engine_timing(totals, before)  # a server restarted between the readings
    assert (went_back["queue"], went_back["prefill"], went_back["ttft"], went_back["requests"]) == (None, None, None, 0)
    appliance = bench_serving.bench_figures(_result(ttft=260.0)) | {"engine_timing_ms": means}
    vllm = bench_serving.bench_figures(_result()) | {"engine_timing_ms": {**means, "prefill": 420.0}}
    line = _table_line(appliance, vllm, "vLLM's own timing")
    assert "appliance 33 / 500 / 500 (6); vllm 33 / 420 / 500 (6)" in line


ENGINE = {
    "model": "SmolLM2-135M-Instruct",
    "model_path": "/srv/models/SmolLM2-135M-Instruct",
    "dtype": "bfloat16",
    "kv_cache_dtype": "bfloat16",
    "max_model_len": 8192,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 2048,
    "kv_block_size": 128,
    "kv_blocks": 233,
    "prefix_caching": True,
    "async_scheduling": False,
}
GIVEN = {"kv_cache_dtype": "auto", "long_prefill_token_threshold": 0, "gpu_memory_utilization": 0.85}


def _options(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(argv, argv[1:], strict=False) if flag.startswith("--")}


def test_vllm_serve_gets_the_engines_settings_and_the_same_kv_capacity():
    argv = bench_serving.vllm_serve_argv(ENGINE, port=8123, python="python", environment=GIVEN)
    assert argv[:5] == ["python", "-m", "inference.engine.vllm_cli", "serve", ENGINE["model_path"]]
    options = _options(argv)
    assert options["--served-model-name"] == "SmolLM2-135M-Instruct" and options["--port"] == "8123"
    assert (options["--dtype"], options["--kv-cache-dtype"]) == ("bfloat16", "auto")
    assert (options["--max-model-len"], options["--max-num-seqs"], options["--max-num-batched-tokens"]) == (
        "8192",
        "32",
        "2048",
    )
    assert (options["--block-size"], options["--num-gpu-blocks-override"]) == ("128", "233")
    assert options["--gpu-memory-utilization"] == "0.85" and options["--long-prefill-token-threshold"] == "0"
    assert {"--enable-chunked-prefill", "--enable-prefix-caching", "--no-async-scheduling"} <= set(argv)
    on_gpu = bench_serving.vllm_serve_argv({**ENGINE, "async_scheduling": True}, port=1, python="p", environment=GIVEN)
    assert "--async-scheduling" in on_gpu and "--no-async-scheduling" not in on_gpu
    assert "--enforce-eager" not in argv
    on_cpu = bench_serving.vllm_serve_argv(
        ENGINE, port=1, python="p", environment={**GIVEN, "gpu_memory_utilization": None}
    )
    assert "--gpu-memory-utilization" not in on_cpu  # unset (the planner's on a GPU): vLLM's own, never "None"
    eager = bench_serving.vllm_serve_argv({**ENGINE, "enforce_eager": True}, port=1, python="p", environment=GIVEN)
    assert "--enforce-eager" in eager  # an uncompiled engine is compared with an uncompiled vllm serve


def test_both_servers_get_the_same_bench_but_for_the_url(tmp_path: Path):
    plan = {"input_len": 256, "output_len": 128, "num_prompts": 48, "concurrency": 4, "warmups": 4}

    def argv(url: str) -> list[str]:
        return bench_serving.bench_argv(
            python="python", base_url=url, engine=ENGINE, plan=plan, seed=7, result_dir=tmp_path, result_file="r.json"
        )

    appliance, vllm = argv("http://127.0.0.1:8000"), argv("http://127.0.0.1:9000")
    assert [a for a, b in zip(appliance, vllm, strict=True) if a != b] == ["http://127.0.0.1:8000"]
    options = _options(appliance)
    assert appliance[3:5] == ["bench", "serve"]
    assert (options["--backend"], options["--endpoint"], options["--dataset-name"]) == (
        "openai-chat",
        "/v1/chat/completions",
        "random",
    )
    assert (options["--random-input-len"], options["--random-output-len"], options["--random-range-ratio"]) == (
        "256",
        "128",
        "0",
    )
    assert (options["--num-prompts"], options["--max-concurrency"], options["--temperature"]) == ("48", "4", "0")
    assert {"--ignore-eos", "--save-result", "--save-detailed"} <= set(appliance)
    assert options["--request-rate"] == "inf"  # by default a new request as soon as one ends
    # No test request before the warm-ups: the appliance's records skip exactly the warm-ups.
    assert (options["--ready-check-timeout-sec"], options["--num-warmups"]) == ("0", "4")


def _both_servers_options(plan: dict, tmp_path: Path) -> tuple[dict, dict]:
    """The bench client's options for the appliance and for ``vllm serve`` under ``plan``."""
    return tuple(
        _options(
            bench_serving.bench_argv(
                python="python",
                base_url=url,
                engine=ENGINE,
                plan=plan,
                seed=7,
                result_dir=tmp_path,
                result_file="r.json",
            )
        )
        for url in ("http://127.0.0.1:8000", "http://127.0.0.1:9000")
    )


def test_lengths_that_vary_and_steady_arrivals_reach_both_servers_alike(tmp_path: Path):
    plan = {"input_len": 256, "output_len": 128, "num_prompts": 48, "concurrency": 4, "warmups": 4,
            "range_ratio": 0.5, "request_rate": 0.3}  # fmt: skip
    appliance, vllm = _both_servers_options(plan, tmp_path)
    for options in (appliance, vllm):
        assert (options["--random-range-ratio"], options["--request-rate"]) == ("0.5", "0.3")
        assert options["--max-concurrency"] == "4"  # still a cap on what is in flight


def test_both_servers_can_be_measured_on_the_completions_endpoint(tmp_path: Path):
    """``--api completions``: vLLM's bench client's own default (backend "openai", the raw prompt
    on /v1/completions), on both servers alike."""
    plan = {
        "input_len": 256,
        "output_len": 128,
        "num_prompts": 48,
        "concurrency": 4,
        "warmups": 4,
        "api": "completions",
    }
    appliance, vllm = _both_servers_options(plan, tmp_path)
    for options in (appliance, vllm):
        assert (options["--backend"], options["--endpoint"]) == ("openai", "/v1/completions")
    given = {"repeats": 1, "input_len": 256, "output_len": 96, "concurrency": 4, "num_prompts": 24,
             "warmups": None, "seed": 1, "timeout": 60, "range_ratio": 0.0, "request_rate": float("inf")}  # fmt: skip
    assert bench_serving._plan(given)["api"] == "chat"  # the default, as before
    plan = bench_serving._plan({**given, "api": "completions"})
    header = bench_serving.table({"parameters": plan, "engine": {}, "summary": {}, "repeats": []})[0]
    assert "on /v1/completions" in header


def test_the_workload_options_are_checked_and_named_in_the_table():
    given = {"repeats": 1, "input_len": 256, "output_len": 96, "concurrency": 4, "num_prompts": 24,
             "warmups": None, "seed": 1, "timeout": 60, "range_ratio": 0.0, "request_rate": float("inf")}  # fmt: skip
    assert bench_serving._plan(given)["request_rate"] is None  # JSON has no infinity
    for bad in ({"range_ratio": 1.0}, {"range_ratio": -0.1}, {"request_rate": 0.0}):
        with pytest.raises(CommandError):
            bench_serving._plan({**given, **bad})
    plan = bench_serving._plan({**given, "range_ratio": 0.5, "request_rate": 0.25})
    header = bench_serving.table({"parameters": plan, "engine": {}, "summary": {}, "repeats": []})[0]
    assert "within 50% either side" in header and "arriving at 0.25/s (Poisson)" in header


def test_the_cli_shim_names_the_cpu_build_as_vllm_and_leaves_other_packages_alone(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)  # restored afterwards
    vllm_cli._patch_version()
    assert "cpu" in importlib.metadata.version("vllm") or importlib.metadata.version("vllm") == _cuda_build()
    assert importlib.metadata.version("django") == importlib.metadata.distribution("django").version


def _cuda_build() -> str | None:
    try:
        return importlib.metadata.distribution("vllm").version
    except importlib.metadata.PackageNotFoundError:
        return None
