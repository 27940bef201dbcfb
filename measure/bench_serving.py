"""``manage.py bench serving``: streaming as real clients measure it, beside ``vllm serve``.

vLLM's own bench client (``vllm bench serve``, run through ``inference.engine.vllm_cli``) streams
chat completions (or, with ``--api completions``, completions of raw prompts: the client's own
default) from the appliance's ``/v1`` and from ``vllm serve`` of the same model
directory with the same engine settings, on the same workload: ``--dataset-name random`` with
fixed input and output lengths (``--ignore-eos``), a fixed ``--max-concurrency`` and number of
prompts, greedy sampling. The client times what a user's tool would: TTFT to the first chunk,
ITL between chunks, TPOT per output token, output tokens/s over the run.

The appliance side is its real path, with processes of this command's own: the engine host, a
decode worker (as ``make run`` starts it, its pool at least the concurrency) and the web server,
reached with the API token of a ``bench-serving`` account (revoked and deleted afterwards). The
``vllm serve`` side gets what the appliance's engine reports: dtype, KV-cache dtype, context,
``max_num_seqs``, ``max_num_batched_tokens``, long-prefill threshold, block size and number of KV
blocks (so the same KV capacity), async scheduling, chunked prefill and prefix caching. The two
never run at once: the engine host is stopped while ``vllm serve`` runs, and the other way
round.

Each of ``--repeats`` measures both, in alternating order (appliance first, then vLLM first, ...,
so that a drift of the machine's load does not favour one), and each ratio (appliance / vLLM) is
taken within its repeat and reported as the mean with a 95 % interval. Targets: output tokens/s
>= 0.98x, client TTFT p50 <= 1.5x, client ITL p99 <= 1.5x; TPOT p50 and ITL p50 are shown
beside them. Each side's tokens per chunk says how many tokens a chunk carried (1 when every
token is sent as the engine writes it), and the CPU seconds each of its processes spent per
1000 output tokens says where the machine's time went.

It refuses to run beside ``make run`` (it needs the engine to itself). On a GPU box with another
model (``APPLIANCE_MODEL``) the same command is the whole procedure; lengths, concurrency and
prompts are options whose defaults suit a 2-core CPU and the small model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone

from appliance.embedded import free_port
from appliance.processes import start_appliance_processes, stop_groups
from inference.timing import percentile
from measure.benchmarking import (
    Progress,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    machine,
    served_queues,
    start_logged,
    wait_for_engine,
    wait_for_queues,
)
from measure.intervals import interval, meets

HELP = (
    "vLLM's bench client against the appliance's /v1 and against `vllm serve` of the same model and engine "
    "settings, alternating; output tokens/s, TTFT, ITL and TPOT ratios with 95 % intervals"
)

USERNAME = "bench-serving"
logger = logging.getLogger(__name__)

SERVERS = ("appliance", "vllm")
# name -> (key in vLLM's result JSON, the ratio's target, whether the ratio must stay below it)
METRICS = {
    "output_tokens_per_s": ("output_throughput", 0.98, False),
    "ttft_p50_ms": ("median_ttft_ms", 1.5, True),
    "itl_p99_ms": ("p99_itl_ms", 1.5, True),
    "tpot_p50_ms": ("median_tpot_ms", None, True),
    "itl_p50_ms": ("median_itl_ms", None, True),
}
LABELS = {
    "output_tokens_per_s": "output tokens/s",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "itl_p99_ms": "ITL p99 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "itl_p50_ms": "ITL p50 (ms)",
}
SERVER_START_TIMEOUT_S = 900  # a fresh machine compiles the model's graphs once


# --api: vLLM's bench backend and the endpoint it calls, alike on both servers.
APIS = {"chat": ("openai-chat", "/v1/chat/completions"), "completions": ("openai", "/v1/completions")}


def add_arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the pair (intervals need 2 or more)")
    parser.add_argument("--input-len", type=int, default=256, help="prompt tokens per request (default 256)")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens per request (default 128)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per run (default 64)")
    parser.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="prompt and output lengths drawn within this fraction either side of --input-len and --output-len "
        "(vLLM's --random-range-ratio; default 0: every request the same, so requests tend to start and end "
        "together in waves)",
    )
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests per second arriving as a Poisson process, at most --concurrency in flight "
        "(default inf: a new request as soon as one ends)",
    )
    parser.add_argument(
        "--warmups", type=int, help="warm-up requests before each run, not measured (default: the concurrency)"
    )
    parser.add_argument("--seed", type=int, default=20261215, help="the random dataset's seed (+ the repeat)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one bench run may take")
    parser.add_argument(
        "--api",
        choices=sorted(APIS),
        default="chat",
        help="the endpoint both servers are measured on: chat (/v1/chat/completions, the prompt in the chat "
        "template; default) or completions (/v1/completions, the raw prompt: vLLM's bench client's default)",
    )


def run(command, **options) -> dict:
    def write(line: str) -> None:
        command.stdout.write(line)
        command.stdout.flush()

    progress = Progress(write)
    plan = _plan(options)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per readiness poll
    # Undone in reverse order, whatever fails or on Ctrl-C: the bench client, the processes
    # still running (last started first), the account and its token, the embedded services.
    with contextlib.ExitStack() as undo:
        for ensure in (ensure_embedded_database, ensure_embedded_broker):
            service = ensure(progress)
            if service:
                undo.callback(_stop_service, service, progress)
        check_migrated(progress)
        _refuse_if_appliance_running()
        account = _Account.create(expires_at=timezone.now() + timedelta(seconds=_budget_s(plan)))
        undo.callback(account.close)
        bench = _Bench(progress, plan, account)
        undo.callback(bench.close)
        engine = bench.start_appliance()
        results: dict = {
            "machine": machine(),
            "engine": {k: v for k, v in engine.items() if not isinstance(v, dict | list)},
            "parameters": plan,
            "repeats": [],
        }
        for index in range(plan["repeats"]):
            order = SERVERS if index % 2 == 0 else SERVERS[::-1]
            progress(f"--- repeat {index + 1} of {plan['repeats']}: {order[0]} first ---")
            measured = {name: bench.measure(name, index) for name in order}
            results["repeats"].append(
                {
                    "order": list(order),
                    **measured,
                    "ratios": ratios(measured["appliance"], measured["vllm"]),
                    "load_average": os.getloadavg(),
                }
            )
        results["vllm_serve_argv"] = bench.vllm_argv
        results["summary"] = summarise(results["repeats"])
        results["targets"] = {name: target for name, (_, target, _) in METRICS.items() if target is not None}
        results["machine"]["load_average_at_end"] = os.getloadavg()
        write("")
        for line in table(results):
            write(line)
        return results


def _plan(options: dict) -> dict:
    for name in ("repeats", "input_len", "output_len", "concurrency", "num_prompts", "timeout"):
        if options[name] <= 0:
            raise CommandError(f"--{name.replace('_', '-')} must be more than 0")
    warmups = options["concurrency"] if options["warmups"] is None else options["warmups"]
    if warmups < 0:
        raise CommandError("--warmups must be 0 or more")
    if not 0.0 <= options["range_ratio"] < 1.0:
        raise CommandError("--range-ratio must be at least 0 and less than 1")
    if not options["request_rate"] > 0:
        raise CommandError("--request-rate must be more than 0 (inf: a new request as soon as one ends)")
    return {
        "repeats": options["repeats"],
        "input_len": options["input_len"],
        "output_len": options["output_len"],
        "concurrency": options["concurrency"],
        "num_prompts": options["num_prompts"],
        "range_ratio": options["range_ratio"],
        # None: a new request as soon as one ends (JSON has no infinity)
        "request_rate": None if options["request_rate"] == float("inf") else options["request_rate"],
        "warmups": warmups,
        "seed": options["seed"],
        "timeout_s": options["timeout"],
        "api": options.get("api") or "chat",
    }


def _budget_s(plan: dict) -> float:
    """How long the account's token must live: every run, and every server start."""
    return plan["repeats"] * 2 * (plan["timeout_s"] + SERVER_START_TIMEOUT_S) + 3600


def _stop_service(service, progress: Progress) -> None:
    progress("stopping the embedded service this benchmark started")
    service.stop()


def _refuse_if_appliance_running() -> None:
    """The comparison needs the engine to itself: `make run`'s engine would share the device,
    and its workers would take this benchmark's jobs off the decode queue."""
    from inference.engine.client import EngineClient, EngineUnavailable

    busy = sorted(name for name, queues in served_queues().items() if queues & {"prefill", "decode"})
    if busy:
        raise CommandError(
            f"Workers are serving the inference queues ({', '.join(busy)}): stop `make run` first. This benchmark "
            "starts an engine host, a worker and a web server of its own, then `vllm serve`, and needs the engine "
            "to itself."
        )
    for path, whose in ((settings.APPLIANCE_ENGINE_SOCKET, "`make run`'s"), (_bench_socket(), "another bench's")):
        try:
            EngineClient(Path(path), connect_timeout_s=2.0).stats(timeout_s=5)
        except EngineUnavailable:
            continue
        raise CommandError(
            f"{whose.capitalize()} engine host answers at {path}: stop it first. This benchmark starts an engine "
            "host of its own, then `vllm serve`, and needs the device to itself."
        )


def _bench_socket() -> Path:
    return Path(settings.VAR_DIR) / "bench" / "serving" / "engine.sock"


# --- what vLLM's bench client reports (pure) ---------------------------------------------------


def bench_figures(result: dict) -> dict:
    """The figures of one ``vllm bench serve`` result (its ``--save-result`` JSON, saved with
    ``--save-detailed``): the metrics compared, what completed and failed, and how many tokens a
    chunk carried on average (chunks are the client's ITL samples plus each request's first)."""
    figures: dict[str, Any] = {name: _number(result.get(key)) for name, (key, _, _) in METRICS.items()}
    figures.update(
        {
            "completed": int(result.get("completed") or 0),
            "failed": int(result.get("failed") or 0),
            "duration_s": _number(result.get("duration")),
            "output_tokens": int(result.get("total_output_tokens") or 0),
            "ttft_p99_ms": _number(result.get("p99_ttft_ms")),
        }
    )
    itls, lengths = result.get("itls"), result.get("output_lens")
    if itls and lengths:
        chunks = sum(len(gaps) + 1 for gaps, n in zip(itls, lengths, strict=False) if n)
        figures["tokens_per_chunk"] = round(sum(lengths) / chunks, 2) if chunks else None
    errors = [e for e in result.get("errors") or () if e]
    if errors:
        figures["first_error"] = str(errors[0]).strip().splitlines()[-1][:300]
    return figures


# Where the appliance's own TTFT goes, from its records of a repeat's requests (``RequestMetrics``):
# job created -> a worker started it (queue); waiting in the engine for KV blocks and a turn
# (admission, vLLM's queued -> scheduled); the engine host's submitting it -> its first token
# there, less that wait (prefill); the rest of its TTFT (setup: the worker's start until the
# engine host submits the request, and the first token's way from the host to the worker). The
# client's TTFT less the appliance's is the HTTP request's way to the job row and the first
# token's way from the worker to the client.
TTFT_PARTS = ("queue", "setup", "admission", "prefill", "ttft")


def ttft_parts(rows: list[dict]) -> dict | None:
    """p50 and p95 (ms) of each part of ``TTFT_PARTS`` over ``rows`` (dicts of a request's
    ``queue_wait_ms``, ``admission_wait_ms``, ``prefill_ms`` and ``ttft_ms``). Pure."""
    rows = [r for r in rows if r.get("ttft_ms") is not None and r.get("prefill_ms") is not None]
    if not rows:
        return None
    parts: dict[str, list[float]] = {part: [] for part in TTFT_PARTS}
    for row in rows:
        queue, admission, prefill = row["queue_wait_ms"], row["admission_wait_ms"], row["prefill_ms"]
        parts["queue"].append(queue)
        parts["admission"].append(admission)
        parts["prefill"].append(prefill)
        parts["setup"].append(max(0.0, row["ttft_ms"] - queue - admission - prefill))
        parts["ttft"].append(row["ttft_ms"])
    return {
        part: {"p50": round(percentile(values, 50) or 0.0, 1), "p95": round(percentile(values, 95) or 0.0, 1)}
        for part, values in parts.items()
    } | {"requests": len(rows)}


# vLLM's own timing of the requests, the same counters on both servers: the engine host sums
# them from vLLM's iteration stats (``EngineStats.request_timing``), ``vllm serve`` exports them
# as Prometheus histograms. Means over a run, from the sums before and after it: what each
# engine took between the frontend's arrival and its first token (ttft), waiting in the engine
# core's queue (queue) and from being scheduled to the first token (prefill). What the engine
# host adds around vLLM is the appliance's prefill less vLLM's ttft.
ENGINE_TIMING = {  # request_timing key -> (its count's key, vLLM's Prometheus histogram)
    "queue_s": ("requests_finished", "vllm:request_queue_time_seconds"),
    "prefill_s": ("requests_finished", "vllm:request_prefill_time_seconds"),
    "ttft_s": ("first_tokens", "vllm:time_to_first_token_seconds"),
}

_COUNTED_BY = {count: key for key, (count, _) in reversed(ENGINE_TIMING.items())}  # its first histogram


def prometheus_timing(text: str) -> dict[str, float]:
    """``request_timing``'s sums and counts from ``vllm serve``'s /metrics text (every label set
    summed). Pure."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        for key, (count, histogram) in ENGINE_TIMING.items():
            if name == f"{histogram}_sum":
                totals[key] = totals.get(key, 0.0) + float(value)
            elif name == f"{histogram}_count" and key == _COUNTED_BY[count]:  # one histogram per count
                totals[count] = totals.get(count, 0.0) + float(value)
    return totals


def engine_timing(before: dict | None, after: dict | None) -> dict | None:
    """Means (ms) of ``ENGINE_TIMING`` over the requests between two readings. Pure."""
    if not before or not after:
        return None
    out: dict[str, Any] = {}
    for key, (count, _) in ENGINE_TIMING.items():
        n = after.get(count, 0) - before.get(count, 0)
        spent = after.get(key, 0.0) - before.get(key, 0.0)
        # None for no request between, or counters that went back (a server restarted between).
        out[key.removesuffix("_s")] = round(1000 * spent / n, 1) if n > 0 and spent >= 0 else None
    out["requests"] = max(0, int(after.get("requests_finished", 0) - before.get("requests_finished", 0)))
    return out


def _number(value) -> float | None:
    return None if value is None else round(float(value), 3)


def ratios(appliance: dict, vllm: dict) -> dict:
    """appliance / vLLM for every metric, within one repeat; None where either side is missing,
    or had failed requests (its figures then describe another workload)."""
    if appliance.get("failed") or vllm.get("failed"):
        return dict.fromkeys(METRICS)
    out = {}
    for name in METRICS:
        a, b = appliance.get(name), vllm.get(name)
        out[name] = round(a / b, 4) if a is not None and b else None
    return out


def summarise(repeats: list[dict]) -> dict:
    """Each ratio's mean and 95 % interval over the repeats, and against its target; beside it
    each server's own mean. A repeat with failed requests does not count."""
    counted = [r for r in repeats if not any(r[server].get("failed") for server in SERVERS)]
    summary = {}
    for name, (_, target, below) in METRICS.items():
        value = interval([repeat["ratios"].get(name) for repeat in counted])
        entry: dict[str, Any] = {"ratio": value.to_dict() if value else None}
        for server in SERVERS:
            side = interval([repeat[server].get(name) for repeat in counted])
            entry[server] = side.to_dict(1) if side else None
        if target is not None:
            entry["target"] = f"{'<=' if below else '>='} {target}x"
            entry["verdict"] = meets(value, target, below=below)
        summary[name] = entry
    return summary


def table(results: dict) -> list[str]:
    plan, engine = results["parameters"], results["engine"]
    lines = [
        f"bench serving: {engine.get('model')} on {engine.get('device_name')}; {plan['num_prompts']} requests of "
        f"{plan['input_len']} tokens in / {plan['output_len']} out{_spread_text(plan)}, "
        f"{plan['concurrency']} at most at once{_arrivals_text(plan)}, "
        f"{len(results['repeats'])} repeat(s), on {APIS[plan.get('api') or 'chat'][1]}; "
        "ratios are appliance over vllm serve, each within a repeat",
        "",
        f"{'':18}{'appliance /v1':>16}{'vllm serve':>14}{'ratio, mean [95 % CI]':>28}{'target':>10}  verdict",
    ]
    for name, entry in results["summary"].items():
        sides = [_mean(entry[server]) for server in SERVERS]
        ratio = entry["ratio"]
        shown = "-" if ratio is None else f"{ratio['mean']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"
        lines.append(
            f"{LABELS[name]:18}{sides[0]:>16}{sides[1]:>14}{shown:>28}{entry.get('target', ''):>10}  "
            f"{entry.get('verdict', '')}"
        )
    lines.append("")
    for index, repeat in enumerate(results["repeats"]):
        parts = []
        for server in SERVERS:
            side = repeat[server]
            chunk = side.get("tokens_per_chunk")
            parts.append(
                f"{server}: {side['completed']} done, {side['failed']} failed, "
                f"{side['output_tokens_per_s'] or 0:.1f} tok/s, TTFT p50 {side['ttft_p50_ms'] or 0:.0f} ms, "
                f"ITL p99 {side['itl_p99_ms'] or 0:.0f} ms"
                + ("" if chunk is None else f", {chunk:g} tokens/chunk")
                + _cpu_text(side.get("cpu_s_per_1k_tokens"))
                + (f" ({side['first_error']})" if side.get("first_error") else "")
            )
        load = repeat.get("load_average")
        lines.append(f"repeat {index + 1} ({' then '.join(repeat['order'])}, load {load[0]:.1f}): " + "; ".join(parts))
        engines = [(server, repeat[server].get("engine_timing_ms")) for server in SERVERS]
        if all(timing for _, timing in engines):
            lines.append(
                "  vLLM's own timing, means in ms (queue / prefill / TTFT at its frontend): "
                + "; ".join(
                    f"{server} {_ms(t['queue'])} / {_ms(t['prefill'])} / {_ms(t['ttft'])} ({t['requests']})"
                    for server, t in engines
                )
            )
        spent = repeat["appliance"].get("ttft_parts_ms")
        if spent:
            lines.append(
                "  appliance TTFT, p50 / p95 ms: "
                + ", ".join(f"{part} {spent[part]['p50']:.0f} / {spent[part]['p95']:.0f}" for part in TTFT_PARTS)
                + f" (its own records of {spent['requests']} requests; the client's TTFT p50 "
                f"{repeat['appliance'].get('ttft_p50_ms') or 0:.0f} ms)"
            )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _spread_text(plan: dict) -> str:
    ratio = plan.get("range_ratio") or 0.0
    return f" (each within {ratio:.0%} either side)" if ratio else ""


def _arrivals_text(plan: dict) -> str:
    rate = plan.get("request_rate")
    return "" if rate is None else f", arriving at {rate:g}/s (Poisson)"


def _cpu_text(cpu: dict | None) -> str:
    if not cpu:
        return ""
    return ", CPU s per 1k tokens: " + " + ".join(f"{name.removeprefix('the ')} {s:g}" for name, s in cpu.items())


def _mean(entry: dict | None) -> str:
    return "-" if entry is None else f"{entry['mean']:g}"


# --- the command lines (pure) --------------------------------------------------------------------


def _engine_settings() -> dict:
    """What the appliance's engine host is given beside what it reports in its stats."""
    return {
        "kv_cache_dtype": settings.APPLIANCE_KV_CACHE_DTYPE,
        "long_prefill_token_threshold": settings.APPLIANCE_LONG_PREFILL_TOKEN_THRESHOLD,
        "gpu_memory_utilization": settings.APPLIANCE_GPU_MEMORY_UTILIZATION,
    }


def vllm_serve_argv(engine: dict, *, port: int, python: str, environment: dict) -> list[str]:
    """``vllm serve`` of the model the appliance's engine serves, with the engine's settings:
    ``engine`` is its stats (what vLLM resolved: dtype, context, KV blocks, ...), ``environment``
    what it was given (``_engine_settings``). The KV cache is the same number of blocks of the
    same size, so both serve the same capacity."""
    argv = [
        python, "-m", "inference.engine.vllm_cli", "serve", str(engine["model_path"]),
        "--served-model-name", str(engine["model"]),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", str(engine["dtype"]),
        "--kv-cache-dtype", str(environment["kv_cache_dtype"]),
        "--max-model-len", str(engine["max_model_len"]),
        "--max-num-seqs", str(engine["max_num_seqs"]),
        "--max-num-batched-tokens", str(engine["max_num_batched_tokens"]),
        "--long-prefill-token-threshold", str(environment["long_prefill_token_threshold"]),
        "--block-size", str(engine["kv_block_size"]),
        "--num-gpu-blocks-override", str(engine["kv_blocks"]),
        "--enable-chunked-prefill",
        "--enable-prefix-caching" if engine.get("prefix_caching", True) else "--no-enable-prefix-caching",
        "--async-scheduling" if engine.get("async_scheduling") else "--no-async-scheduling",
        "--disable-uvicorn-access-log",  # as the appliance's web server (--no-access-log)
    ]  # fmt: skip
    # As given, else what the engine took (the planner's, on a GPU); on a CPU neither: vLLM's own.
    utilization = environment.get("gpu_memory_utilization") or engine.get("gpu_memory_utilization")
    if utilization is not None:
        argv += ["--gpu-memory-utilization", str(utilization)]
    if engine.get("enforce_eager"):
        argv.append("--enforce-eager")  # compiled or not, as the appliance's engine
    return argv


def bench_argv(
    *, python: str, base_url: str, engine: dict, plan: dict, seed: int, result_dir: Path, result_file: str
) -> list[str]:
    """``vllm bench serve``, the same for both servers but for the URL."""
    backend, endpoint = APIS[plan.get("api") or "chat"]
    return [
        python, "-m", "inference.engine.vllm_cli", "bench", "serve",
        "--backend", backend, "--base-url", base_url, "--endpoint", endpoint,
        "--model", str(engine["model_path"]), "--served-model-name", str(engine["model"]),
        "--tokenizer", str(engine["model_path"]),
        "--dataset-name", "random",
        "--random-input-len", str(plan["input_len"]), "--random-output-len", str(plan["output_len"]),
        "--random-range-ratio", format(plan.get("range_ratio") or 0, "g"), "--ignore-eos", "--temperature", "0",
        "--num-prompts", str(plan["num_prompts"]), "--max-concurrency", str(plan["concurrency"]),
        "--request-rate", str(plan.get("request_rate") or "inf"), "--num-warmups", str(plan["warmups"]),
        "--seed", str(seed), "--ready-check-timeout-sec", "0",  # no test request: both servers are up
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
        "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", result_file,
        "--disable-tqdm",
    ]  # fmt: skip


# --- the account the appliance's requests come from -----------------------------------------------


class _Account:
    """A ``bench-serving`` account that cannot sign in, with an API token for this run only.
    Afterwards its token is revoked and deleted, its jobs are deleted, and it is switched off."""

    def __init__(self, user, token_row, token: str) -> None:
        self.user, self.token_row, self.token = user, token_row, token

    @classmethod
    def create(cls, *, expires_at) -> _Account:
        from api.services import token_create
        from measure.benchmarking import api_bench_user

        user = api_bench_user(USERNAME, deletes="jobs and tokens")
        cls._clear(user)  # what a run that was killed left
        row, token = token_create(
            user=user,
            name="manage.py bench serving",
            scopes=["read", "write"],
            expires_at=expires_at,
            rate_limit_per_minute=100_000,  # a load test, not a person
            max_streams=100_000,
        )
        return cls(user, row, token)

    @staticmethod
    def _clear(user) -> None:
        from api.models import ApiToken
        from api.services import token_revoke
        from inference.models import Job

        for token in ApiToken.objects.filter(user=user):
            token_revoke(token=token)
        ApiToken.objects.filter(user=user).delete()
        _Account._clear_jobs(Job.objects.filter(owner=user))

    @staticmethod
    def _clear_jobs(jobs) -> None:
        """Cancel those not finished (their engine requests end), then delete them all."""
        from inference.models import Job
        from inference.services import job_cancel

        for job in jobs.exclude(state__in=Job.FINISHED_STATES):
            job_cancel(job=job)
        jobs.delete()

    def measured_requests(self, *, skip: int) -> list[dict]:
        """The timing of the requests made since the last call, in the order they were made,
        less the first ``skip`` (the client's test request and warm-ups); their jobs are then
        deleted (any not finished cancelled first). A request that failed has no timing."""
        from inference.models import Job, RequestMetrics

        jobs = list(Job.objects.filter(owner=self.user).order_by("created_at", "pk").values_list("pk", flat=True))
        fields = ("job_id", "queue_wait_ms", "admission_wait_ms", "prefill_ms", "ttft_ms")
        timing = {row["job_id"]: row for row in RequestMetrics.objects.filter(job_id__in=jobs).values(*fields)}
        self._clear_jobs(Job.objects.filter(pk__in=jobs))
        return [timing[pk] for pk in jobs[skip:] if pk in timing]

    def close(self) -> None:
        self._clear(self.user)
        self.user.is_active = False
        self.user.save(update_fields=["is_active"])


# --- the servers ---------------------------------------------------------------------------------


class _Bench:
    def __init__(self, progress: Progress, plan: dict, account: _Account) -> None:
        self.progress = progress
        self.plan = plan
        self.account = account
        self.dir = Path(settings.VAR_DIR) / "bench" / "serving"
        self.log_dir = self.dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.result_dir = self.dir / timezone.now().strftime("%Y%m%dT%H%M%SZ")
        self.socket = _bench_socket()
        self.engine: dict = {}
        self.started: list[tuple[str, subprocess.Popen]] = []  # what runs, in the order it started
        self.server = ""  # "the engine host" or "vllm serve", whichever runs
        self.web_url = ""
        self.vllm_port = free_port()
        self.vllm_argv: list[str] = []

    def _env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "APPLIANCE_ENGINE_SOCKET": str(self.socket),
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            "HF_HUB_OFFLINE": "1",
            **extra,
        }

    def start_appliance(self) -> dict:
        """The engine host, then the worker of the queue chat jobs go to (decode; under
        ``APPLIANCE_SCHEDULING=fifo``, the one queue every job goes through) and the web server;
        the engine's stats."""
        from inference.lifecycle import celery_queue_for
        from inference.models import Queue

        self._start_engine_host()
        pool = max(settings.APPLIANCE_DECODE_CONCURRENCY, self.plan["concurrency"])
        queue = celery_queue_for(Queue.DECODE)
        caps = SimpleNamespace(
            BASE_DIR=settings.BASE_DIR,
            APPLIANCE_INGEST_CONCURRENCY=1,
            APPLIANCE_PREFILL_CONCURRENCY=pool,
            APPLIANCE_DECODE_CONCURRENCY=pool,
        )
        port = free_port()
        self.web_url = f"http://127.0.0.1:{port}"
        self.progress(f"starting a {queue} worker (pool {pool}) and a web server on {self.web_url}")
        processes = start_appliance_processes(
            {f"{queue}-worker", "web"},
            settings=caps,
            tag="bench-serving",
            env=self._env(),
            log_dir=self.log_dir,
            port=port,
        )
        self.started += zip((f"the {queue} worker", "the web server"), processes, strict=True)
        wait_for_queues({queue}, log_dir=self.log_dir)
        self._wait_for_http(f"{self.web_url}/v1/models", {"Authorization": f"Bearer {self.account.token}"}, "web")
        return self.engine

    def _start_engine_host(self) -> None:
        log = self.log_dir / "engine.log"
        self.progress("starting the appliance's engine host (a minute or two)")
        process = start_logged(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "engine_host"], env=self._env(), log_path=log
        )
        self.started.append(("the engine host", process))
        self.server = "the engine host"
        stats = wait_for_engine(self.socket, process=process, log_path=log, timeout_s=SERVER_START_TIMEOUT_S)
        if self.engine and _comparable(stats) != _comparable(self.engine):
            raise CommandError(f"the engine host came back with other settings: {_comparable(stats)}")
        self.engine = stats
        self.progress(
            f"engine: {stats['model']} on {stats['device_name']}, {stats['dtype']}, context {stats['max_model_len']}, "
            f"KV {stats['kv_blocks']} blocks of {stats['kv_block_size']}, max_num_seqs {stats['max_num_seqs']}"
        )

    def _start_vllm_serve(self) -> None:
        log = self.log_dir / "vllm-serve.log"
        argv = vllm_serve_argv(self.engine, port=self.vllm_port, python=sys.executable, environment=_engine_settings())
        self.vllm_argv = argv[1:]
        self.progress("starting vllm serve with the engine's settings (a minute or two)")
        env = self._env()
        if self.engine.get("device") == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.APPLIANCE_CPU_KV_CACHE_GIB))  # as the engine host
        process = start_logged(argv, env=env, log_path=log)
        self.started.append(("vllm serve", process))
        self.server = "vllm serve"
        self._wait_for_http(f"http://127.0.0.1:{self.vllm_port}/health", {}, "vllm serve", process=process)

    def _wait_for_http(self, url: str, headers: dict, what: str, *, process=None) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                    return
            if process is not None and process.poll() is not None:
                raise CommandError(f"{what} exited with code {process.returncode}; see {self.log_dir}")
            if time.monotonic() > deadline:
                raise CommandError(f"{what} did not answer at {url}; see {self.log_dir}")
            time.sleep(1)

    def _use(self, name: str) -> str:
        """Make ``name``'s server the one running; its base URL."""
        wanted = "the engine host" if name == "appliance" else "vllm serve"
        if self.server != wanted:
            self._stop(self.server)
            if name == "appliance":
                self._start_engine_host()
            else:
                self._start_vllm_serve()
        return self.web_url if name == "appliance" else f"http://127.0.0.1:{self.vllm_port}"

    def _stop(self, name: str) -> None:
        for entry in [e for e in self.started if e[0] == name]:
            self.progress(f"stopping {name}")
            stop_groups([entry[1]], timeout_s=60)
            self.started.remove(entry)
        if self.server == name:
            self.server = ""

    def measure(self, name: str, repeat: int) -> dict:
        base_url = self._use(name)
        self.result_dir.mkdir(parents=True, exist_ok=True)
        result_file = f"{name}-{repeat + 1}.json"
        argv = bench_argv(
            python=sys.executable,
            base_url=base_url,
            engine=self.engine,
            plan=self.plan,
            seed=self.plan["seed"] + repeat,  # the same prompts for both servers within a repeat
            result_dir=self.result_dir,
            result_file=result_file,
        )
        log = self.log_dir / f"bench-{name}-{repeat + 1}.log"
        log.unlink(missing_ok=True)
        # The token goes by the environment (vLLM's client reads OPENAI_API_KEY), not the command line.
        env = self._env(OPENAI_API_KEY=self.account.token if name == "appliance" else "")
        self.progress(f"vllm bench serve against {name} ({base_url})")
        timing_before = self._engine_timing(name)
        cpu_before = self._cpu_s()
        process = start_logged(argv, env=env, log_path=log)
        try:
            code = process.wait(timeout=self.plan["timeout_s"])
        except subprocess.TimeoutExpired:
            raise CommandError(f"the bench against {name} took more than {self.plan['timeout_s']:.0f} s") from None
        finally:
            stop_groups([process], timeout_s=10)
        cpu_after = self._cpu_s()
        timing_after = self._engine_timing(name)
        path = self.result_dir / result_file
        if code != 0 or not path.exists():
            raise CommandError(f"vllm bench serve against {name} failed (exit code {code}); see {log}")
        figures = bench_figures(json.loads(path.read_text()))
        figures["result_file"] = str(path)
        if name == "appliance":
            figures["ttft_parts_ms"] = ttft_parts(self.account.measured_requests(skip=self.plan["warmups"]))
        # The warm-ups are in these means too, on both sides alike.
        figures["engine_timing_ms"] = engine_timing(timing_before, timing_after)
        # Where the machine's time went: CPU seconds of each process this benchmark started (with
        # its children) per 1000 output tokens, counting the warm-ups, which the processes served
        # too (the client sends no test request: its ready check is off).
        tokens = figures["output_tokens"] + self.plan["warmups"] * self.plan["output_len"]
        figures["cpu_s_per_1k_tokens"] = {
            process: round(1000 * (cpu_after[process] - cpu_before.get(process, 0.0)) / tokens, 3)
            for process in cpu_after
            if tokens
        }
        self.progress(
            f"{name}: {figures['output_tokens_per_s']} output tokens/s, TTFT p50 {figures['ttft_p50_ms']} ms, "
            f"ITL p99 {figures['itl_p99_ms']} ms, {figures.get('tokens_per_chunk')} tokens/chunk, "
            f"{figures['failed']} failed"
        )
        return figures

    def _engine_timing(self, name: str) -> dict | None:
        """vLLM's timing sums so far on ``name``'s server (None if it cannot be read)."""
        from inference.engine.client import EngineClient, EngineRequestError, EngineUnavailable

        try:
            if name == "appliance":
                return EngineClient(self.socket, connect_timeout_s=2.0).stats(timeout_s=10).get("request_timing")
            response = httpx.get(f"http://127.0.0.1:{self.vllm_port}/metrics", timeout=10)
            response.raise_for_status()
            return prometheus_timing(response.text)
        except (EngineUnavailable, EngineRequestError, httpx.HTTPError):
            logger.warning("could not read %s's request timing", name, exc_info=True)
            return None

    def _cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of each process running (its children included)."""
        import psutil  # vLLM's dependency; the web process does not need it

        spent = {}
        for name, process in self.started:
            total = 0.0
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(process.pid)
                for each in [parent, *parent.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        times = each.cpu_times()
                        total += times.user + times.system
            spent[name] = total
        return spent

    def close(self) -> None:
        """Every process still running, in the reverse order of their start."""
        for name, _ in reversed(list(self.started)):
            self._stop(name)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()


def _comparable(stats: dict) -> dict:
    keys = ("model_path", "dtype", "kv_cache_dtype", "max_model_len", "kv_block_size", "kv_blocks", "max_num_seqs")
    return {k: stats.get(k) for k in keys}
