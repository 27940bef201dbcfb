"""``manage.py bench scheduling``: drafting beside documents on one engine, measured so that it
cannot be flattered.

Everything goes through the real path: jobs created by the services, the Celery queues and
worker pools started as ``make run`` starts them, the engine host and the model. The engine host
is one this benchmark starts (with ``--kv-capacity-tokens``), or the one at ``--engine-socket``;
its policy is switched between runs, so that every policy is measured in one run on one engine:

- ``appliance``: the appliance's scheduler inside vLLM (drafting first, documents in what the
  drafting ITL target leaves of each step, KV admission by blocks);
- ``engine``: vLLM's priority scheduling alone, tuned: each ``--thresholds`` value of vLLM's
  ``long_prefill_token_threshold`` is tried on the first repeat, and the best one that meets the
  drafting bounds (else the one with the lowest drafting TTFT) is kept for the other repeats;
- ``fifo``: one queue and one pool, every request at the same priority;
- ``appliance:key=value+...`` (``--variants``): the appliance's scheduler with some of its
  settings (``step_policy.PolicyConfig``) changed, beside its defaults in the same run: how a
  change of the scheduler is shown to be better than what it replaces.

Phases, each repeated ``--repeats`` times; every ratio is taken within one repeat (against a
baseline measured minutes before on the same machine) and reported as a mean with a 95 %
interval over the repeats:

1. ``burst``: episodes of a document backlog submitted at once and a burst of drafting requests
   (``--burst-drafts`` every ``--burst-interval`` s), until ``--min-drafts`` drafts were
   measured. Drafting TTFT p95 and ITL p95 against drafting alone; documents per minute against
   ``fifo``'s. Targets: TTFT <= 2x, ITL <= 1.5x, documents >= 0.9x FIFO.
2. ``steady``: a longer backlog, with drafting arriving steadily (Poisson, ``--steady-rate`` per
   second) for the whole time the backlog runs; only drafts that arrived while documents were
   still running count. By default the rate is ``--steady-load`` (a quarter) of the drafting
   capacity measured on this machine before the first repeat, and the backlog is sized from
   the documents' measured speed (``_Bench.calibrate``): a fixed rate that is a busy office on
   one machine overloads another (a float32 CPU engine), whose queue then grows for as long as
   the backlog runs and measures the queue, not the scheduler. A quarter, because beside a
   backlog drafting has less than the engine alone: documents are owed a fifth of its time
   (``document_min_share``), and steps that hold a chunk beside decodes take longer (up to the
   ITL target, 1.4x). At half the capacity (0.55 drafts a second of 96 tokens on a 2-core
   float32 CPU) the drafters' queue grew through the whole backlog: TTFT p95 24x alone. The same drafting bounds; documents >= 0.35x FIFO and at least the
   tuned ``engine``'s (when it meets the bounds). The bound documents could reach within the
   ITL target is worked out from the step costs the scheduler measured. Drafting alone here
   takes twice ``--min-drafts`` requests, and the p95 ratios are also given over every repeat's
   requests pooled, with a bootstrap interval: a p95 of 60 requests is about the fourth
   slowest, so one stall of a shared machine that catches four moves a repeat's ratio by half.
3. ``eos``: ``steady`` with real EOS-terminated outputs (no ``ignore_eos``): ``appliance`` and
   ``fifo``.
4. ``idle``: the backlog alone through the appliance, against the same prompts run straight on
   the engine under vLLM's own scheduling (raw vLLM). Target >= 0.97x.
5. ``peak``: a burst whose KV demand is ``--peak-factor`` times the KV capacity: fixed lengths
   under ``appliance`` and ``engine`` (failures, preemptions and the highest KV use: what
   admission avoids), then EOS-terminated outputs under the two KV reservations (``max`` and
   ``predicted``): requests per minute, TTFT, preemptions, and which one the interval shows
   serving more. Their requests ask real things of real text (a yes or no, a title, a summary, a
   reply; ``measure.benchmarking.REAL_ASKS`` about Debian's licence texts), so that the answers
   end where the model ends them, at lengths that vary; the predicted run learns from the max
   run's outputs, not from the fixed-length runs before.
6. ``fairness``: one user queues a batch of summaries, a second user then one: how many of the
   first user's jobs started before the second's (target <= 1), and the second's wait in job
   turns.
7. ``prefix``: a clause extraction on a document that was just summarised: its prefill time
   divided by the summary's (target <= 0.3).
8. ``ingest``: steady drafting without and beside an ingest backlog read by the ingest worker,
   in ``--ingest-pairs`` pairs of windows whose order alternates (the worker is held still in
   the windows without it): drafting TTFT p95 and ITL p95 beside the ingest against alone
   (target <= 1.2x each), and the pages per second the ingest read meanwhile.

Pools started for a phase are warmed up first with a few jobs that are not measured.

Lengths scale with the model's context (``--scale auto``: context / 8192), so that the same
command means the same workload on a GPU box with a real model (there, raise
``--min-drafts`` to 200).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.test import override_settings

from appliance.processes import held, start_appliance_processes, stop_groups
from inference.engine.step_policy import OutputLengths
from inference.timing import percentile
from measure.benchmarking import (
    REAL_ASKS,
    REAL_TEXT_DIR,
    Progress,
    bench_user,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    ingest_worker,
    machine,
    real_paragraphs,
    real_passage,
    start_logged,
    synthetic_rng,
    synthetic_sentence,
    wait_for_engine,
    wait_for_queues,
)
from measure.intervals import Interval, format_entry, interval, meets, pooled_ratio

HELP = (
    "drafting beside a document backlog (burst, steady Poisson, EOS) under the appliance, tuned vLLM "
    "priority and FIFO; documents alone vs raw vLLM; peak KV; fairness; prefix reuse; repeats with 95 % intervals"
)

BENCH_USERNAME = "bench-scheduling"
CREATE_ATTEMPTS = 4  # a job's creation refused for the broker, asked for again a second later
PHASES = ("burst", "steady", "eos", "idle", "peak", "fairness", "prefix", "ingest")
TARGETS = {
    "ttft_ratio": 2.0,
    "itl_ratio": 1.5,
    "burst_documents_vs_fifo": 0.9,
    "steady_documents_vs_fifo": 0.35,
    "idle_vs_raw": 0.97,
    "fairness_turns": 1,
    "prefix": 0.3,
    "ingest_ratio": 1.2,
}


def add_arguments(parser) -> None:
    parser.add_argument("--phases", default=",".join(PHASES), help="phases to run, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every phase (intervals need 2 or more)")
    parser.add_argument("--scale", default="auto", help="multiply token lengths ('auto': context / 8192)")
    parser.add_argument("--documents", type=int, default=6, help="documents in a burst episode's backlog")
    parser.add_argument("--document-tokens", type=int, default=2500, help="prompt tokens per document")
    parser.add_argument("--document-output", type=int, default=64, help="output tokens per document job")
    parser.add_argument("--document-pool", type=int, default=6, help="prefill worker threads (documents in flight)")
    parser.add_argument("--draft-tokens", type=int, default=40, help="prompt tokens per drafting request")
    parser.add_argument("--draft-output", type=int, default=96, help="output tokens per drafting request")
    parser.add_argument("--draft-pool", type=int, default=16, help="decode worker threads")
    parser.add_argument("--burst-drafts", type=int, default=8, help="drafting requests in one burst")
    parser.add_argument("--burst-interval", type=float, default=0.4, help="seconds between a burst's drafts")
    parser.add_argument("--min-drafts", type=int, default=60, help="drafting requests measured per point")
    parser.add_argument("--steady-rate", type=_auto_or(float), default="auto",
                        help="drafting arrivals per second (Poisson) of the steady, eos and ingest phases; 'auto': "
                        "--steady-load times the drafting capacity measured on this machine before the first repeat")  # fmt: skip
    parser.add_argument("--steady-load", type=float, default=0.25,
                        help="with --steady-rate auto: the share of the measured drafting capacity the steady stream asks for")  # fmt: skip
    parser.add_argument("--steady-documents", type=_auto_or(int), default="auto",
                        help="documents in the steady backlog; 'auto': enough that, at the documents' measured speed "
                        "alone, the backlog lasts while 1.25 x --min-drafts drafts arrive")  # fmt: skip
    parser.add_argument("--thresholds", default="0,256,512,1024",
                        help="vLLM long_prefill_token_threshold values tried for the engine baseline")  # fmt: skip
    parser.add_argument("--variants", default="",
                        help="appliance scheduler settings to measure beside its defaults in the burst and steady "
                        "phases, comma-separated, each key=value[+key=value] (e.g. chunk_fixed_cost_share=0)")  # fmt: skip
    parser.add_argument("--peak-factor", type=float, default=3.0, help="peak KV demand / KV capacity")
    parser.add_argument("--peak-prompt-tokens", type=int, default=768)
    parser.add_argument("--peak-output", type=int, default=256)
    parser.add_argument("--fair-batch", type=int, default=12, help="summaries the first user queues at once")
    parser.add_argument("--prefix-tokens", type=int, default=6000, help="prompt tokens of the prefix-reuse document")
    parser.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="KV cache of the engine host this benchmark starts (default: 24576 on a CPU, where filling "
        "gigabytes for the peak would take hours; all of it on a GPU)",
    )
    parser.add_argument("--ingest-pages", type=int, default=3000,
                        help="pages of the ingest backlog the ingest phase drafts beside (what is left is cancelled)")  # fmt: skip
    parser.add_argument("--ingest-pairs", type=int, default=5,
                        help="pairs of drafting windows, without and with the ingest, the ingest phase alternates")  # fmt: skip
    parser.add_argument("--engine-socket", help="use the engine host already listening here instead of starting one")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds any one run may take")
    parser.add_argument("--seed", type=int, default=20261201)


_PARAMETERS = (
    "repeats", "documents", "document_tokens", "document_output", "document_pool", "draft_tokens", "draft_output",
    "draft_pool", "burst_drafts", "burst_interval", "min_drafts", "steady_rate", "steady_load", "steady_documents",
    "thresholds", "variants",
    "peak_factor", "peak_prompt_tokens", "peak_output", "fair_batch", "prefix_tokens", "kv_capacity_tokens", "seed",
    "ingest_pages", "ingest_pairs",
)  # fmt: skip


def run(command, **options) -> dict:
    def write(line: str) -> None:
        command.stdout.write(line)
        command.stdout.flush()

    progress = Progress(write)
    phases = _choices(options["phases"], PHASES, "--phases")
    if options["repeats"] < 1:
        raise CommandError("--repeats must be at least 1")
    thresholds = _thresholds(options["thresholds"])
    variants(options["variants"])  # refused before anything starts
    started_services = [s for s in (ensure_embedded_database(progress), ensure_embedded_broker(progress)) if s]
    bench = None
    try:
        check_migrated(progress)
        _refuse_if_appliance_running()
        bench = _Bench(progress, options)
        bench._delete_rows()  # what an interrupted run left (its documents would collide with these)
        bench.start_engine()
        if {"steady", "eos", "ingest"} & set(phases):
            bench.calibrate(phases)  # --steady-rate and --steady-documents 'auto', from this machine's speed
        results: dict = {
            "machine": machine(),
            "ingest_worker": ingest_worker(),
            "engine": {k: v for k, v in bench.engine_stats().items() if not isinstance(v, dict | list)},
            "parameters": {**{k: v for k, v in options.items() if k in _PARAMETERS}, "scale": bench.scale},
            "calibration": bench.calibration,
            "repeats": [],
        }
        for repeat in range(options["repeats"]):
            progress(f"--- repeat {repeat + 1} of {options['repeats']} ---")
            current: dict = {}
            results["repeats"].append(current)
            bench.repeat(repeat, phases, thresholds, into=current, saved=lambda: _write_partial(results))
        results["summary"] = summarise(results["repeats"])
        results["broker_refusals"] = bench.broker_refusals
        results["targets"] = TARGETS
        write("")
        for line in table(results):
            write(line)
        _write_markdown(results)
        return results
    finally:
        if bench is not None:
            bench.close()
        for service in reversed(started_services):
            progress("stopping the embedded service this benchmark started")
            service.stop()


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise CommandError(f"{flag}: choose from {', '.join(allowed)}")
    return chosen


def _auto_or(kind: type) -> Callable[[str], object]:
    """An option's value: ``auto`` or a positive number of ``kind``."""

    def parse(value: str) -> object:
        if value == "auto":
            return value
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'auto' or a number, not {value!r}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
        return number

    parse.__name__ = f"auto or {kind.__name__}"
    return parse


def steady_sizes(*, capacity_per_s: float | None, documents_per_s: float | None, load: float, min_drafts: int,
                 rate: float | str = "auto", documents: int | str = "auto", at_least: int = 1) -> dict:  # fmt: skip
    """The steady stream's rate and backlog from what this machine was measured to do: the
    rate ``load`` times the drafting capacity (drafts finished a second with every decode
    thread busy), the backlog enough documents that, at their speed alone (the fastest they go:
    beside drafting any policy is slower), it lasts while 1.25 x ``min_drafts`` drafts arrive.
    A number given for either is kept. ValueError when a rate would be zero."""
    if rate == "auto":
        rate = round(load * float(capacity_per_s or 0.0), 3)
    rate = float(rate)
    if rate <= 0:
        raise ValueError(f"a rate of {rate} drafts a second (--steady-load {load} x the capacity measured)")
    if documents == "auto":
        documents = max(at_least, math.ceil(round(1.25 * min_drafts / rate * float(documents_per_s or 0.0), 6)))
    return {"steady_rate": rate, "steady_documents": int(documents)}


def variants(value: str) -> dict[str, dict[str, Any]]:
    """``--variants``: mode name (``appliance:key=value+...``) -> the settings it changes. Each
    key must be a setting of the appliance's scheduler (``PolicyConfig``), and a value what that
    setting takes (checked here, so that a typo fails before an hour's run, not in it)."""
    from inference.engine.step_policy import PolicyConfig

    out: dict[str, dict[str, Any]] = {}
    for variant in (v.strip() for v in value.split(",")):
        if not variant:
            continue
        settings_: dict[str, Any] = {}
        for pair in variant.split("+"):
            key, sep, raw = pair.partition("=")
            key = key.strip()
            if not sep or key in {"mode", "long_prefill_token_threshold"}:
                raise CommandError(f"--variants: {pair!r} is not key=value of an appliance scheduler setting")
            try:
                settings_[key] = json.loads(raw)
            except ValueError:
                settings_[key] = raw.strip()
        try:
            PolicyConfig().updated(settings_)
        except (TypeError, ValueError) as exc:
            raise CommandError(f"--variants: {variant}: {exc}") from None
        out[f"appliance:{variant}"] = settings_
    return out


def _thresholds(value: str) -> list[int]:
    try:
        chosen = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise CommandError("--thresholds: whole numbers of tokens, comma-separated") from None
    if not chosen or min(chosen) < 0:
        raise CommandError("--thresholds: at least one value, none negative")
    return chosen


def _refuse_if_appliance_running() -> None:
    """The benchmark needs the engine and the inference queues to itself."""
    from appliance.celery import app

    replies = app.control.inspect(timeout=1.0).active_queues() or {}
    busy = sorted(name for name, queues in replies.items() if any(q["name"] in {"prefill", "decode"} for q in queues))
    if busy:
        raise CommandError(
            f"Workers are serving the inference queues ({', '.join(busy)}): stop `make run` first; "
            "the benchmark starts its own workers and needs the engine to itself."
        )


def reservation_shown(peak: dict) -> str:
    """Which KV reservation the EOS peak runs show serving more requests a minute: ``predicted``
    only if its ratio to ``max`` has an interval above 1 and it failed nothing, ``max`` if the
    interval is below 1, else ``neither`` (the default then stays ``max``: it never preempts)."""
    ratio = peak.get("predicted_vs_max")
    predicted = peak.get("eos:appliance:predicted") or {}
    if not ratio or ratio.get("low") is None or ratio.get("n", 0) < 2:
        return "neither"
    if ratio["low"] > 1 and not any(predicted.get("failed") or []):
        return "predicted"
    if ratio["high"] < 1:
        return "max"
    return "neither"


def _step_times_line(scheduler: dict) -> str:
    """The scheduler's step times by plan (``step_times`` of its snapshot), those of 20 steps or
    more, with the share of the documents' prompt tokens read in such steps (an engine that
    counts them)."""
    times = scheduler.get("step_times") or {}
    documents = sum(t.get("document_tokens", 0) for t in times.values())

    def share(t: dict) -> str:
        return f", {t['document_tokens'] / documents:.0%} of documents" if documents and "document_tokens" in t else ""

    return ", ".join(
        f"{reason} {t['steps']}: {t['p50_ms']} / {t['p95_ms']} (x{t['p95_over_model']}{share(t)})"
        for reason, t in times.items()
        if t["steps"] >= 20
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# --- what one run measured ----------------------------------------------------------------------


def drafting_figures(jobs: list) -> dict:
    """Each request's own ITL p95 (from every token's arrival at its worker), then the p95 of
    those across requests: the inter-token latency 95 % of drafters stay under."""
    if not jobs:
        return {"requests": 0}
    ttfts = [job.metrics.ttft_ms for job in jobs]
    itl_p95s = [job.metrics.itl_p95_ms for job in jobs if job.metrics.itl_p95_ms is not None]
    itl_means = [job.metrics.itl_mean_ms for job in jobs if job.metrics.itl_mean_ms]
    return {
        "requests": len(jobs),
        # Each request's own, for the ratios over the repeats' requests pooled (``summarise``).
        "ttft_ms_each": [_round(v) for v in ttfts],
        "itl_p95_ms_each": [_round(v) for v in itl_p95s],
        "ttft_p50_ms": _round(percentile(ttfts, 50)),
        "ttft_p95_ms": _round(percentile(ttfts, 95)),
        "itl_mean_ms": _round(statistics.mean(itl_means)) if itl_means else None,
        "itl_p95_ms": _round(percentile(itl_p95s, 95)),
        "output_tokens_mean": round(statistics.mean(job.metrics.output_tokens for job in jobs), 1),
        "preemptions": sum(job.metrics.preemptions for job in jobs),
        "ttft_tail": ttft_tail(jobs),
        "busy_s": round(busy_seconds(jobs), 2),
    }


def busy_seconds(jobs: list) -> float:
    """How long at least one of the jobs was in the appliance (the union of their lives, from
    creation to the end): for drafts, the time documents shared the engine with drafting."""
    spans = sorted((job.created_at.timestamp(), job.finished_at.timestamp()) for job in jobs if job.finished_at)
    total, end = 0.0, None
    for start, stop in spans:
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def ttft_tail(jobs: list, q: float = 95) -> dict:
    """Where the slowest drafters' time to first token went, so a tail can be told apart: the
    mean, over the drafts at or above the q-th TTFT percentile, of the wait for a worker
    (``queue_wait_ms``), in the engine for KV blocks and a turn (``admission_wait_ms``), from
    admission to the first token (``prefill_ms``: the steps it waited behind and its own), and
    what is left (the host's and the stream's hops)."""
    cut = percentile([job.metrics.ttft_ms for job in jobs], q)
    slowest = [job for job in jobs if cut is not None and job.metrics.ttft_ms >= cut]
    tail = [job.metrics for job in slowest]
    if not tail:
        return {"requests": 0}
    parts = {
        "queue_wait_ms": [m.queue_wait_ms for m in tail],
        "admission_wait_ms": [m.admission_wait_ms for m in tail],
        "prefill_ms": [m.prefill_ms or 0.0 for m in tail],
    }
    means = {name: statistics.mean(values) for name, values in parts.items()}
    ttft = statistics.mean(m.ttft_ms for m in tail)
    # The worker wait in two: the job's creation to its message sent (the row, its commit, the
    # publish), then to a worker's claim (the broker's delivery, a free thread, the claim).
    sent = [job for job in slowest if job.dispatched_at is not None and job.claimed_at is not None]
    split = (
        {
            "sending_ms": _round(
                statistics.mean((j.dispatched_at - j.created_at).total_seconds() * 1000 for j in sent)
            ),
            "taking_ms": _round(statistics.mean((j.claimed_at - j.dispatched_at).total_seconds() * 1000 for j in sent)),
        }
        if sent
        else {}
    )
    return {
        "requests": len(tail),
        "ttft_ms": _round(ttft),
        **{name: _round(value) for name, value in means.items()},
        **split,
        "other_ms": _round(ttft - sum(means.values())),
    }


def document_figures(jobs: list, started: float) -> dict:
    finished = max(job.finished_at.timestamp() for job in jobs)
    elapsed = finished - started
    tokens = sum(job.metrics.prompt_tokens for job in jobs)
    return {
        "documents": len(jobs),
        "prompt_tokens": tokens,
        "elapsed_s": round(elapsed, 2),
        "documents_per_minute": round(len(jobs) / elapsed * 60, 3),
        "prompt_tokens_per_s": round(tokens / elapsed, 1),
        "preemptions": sum(job.metrics.preemptions for job in jobs),
    }


def last_token_at(jobs: list) -> float | None:
    """When the last of the jobs' engine requests wrote its last token (epoch seconds), from
    their metrics: created + time to first token + the rest of the output at its mean ITL; None
    unless every job made one engine request."""
    ends = []
    for job in jobs:
        metrics = getattr(job, "metrics", None)
        # A job of several engine requests (sections, a retry) has one request's timing but
        # every request's tokens: its end cannot be told from them.
        if metrics is None or metrics.itl_mean_ms is None or metrics.engine_requests != 1:
            return None
        rest_ms = max(0, metrics.output_tokens - 1) * metrics.itl_mean_ms
        ends.append(job.created_at.timestamp() + (metrics.ttft_ms + rest_ms) / 1000)
    return max(ends, default=None)


def _unfinished(job_ids: list) -> bool:
    """Whether any of the jobs is unfinished; a database that is slow to take a connection on a
    saturated machine is asked again rather than ending the run."""
    from django.db import OperationalError, close_old_connections

    from inference.models import Job

    for _ in range(4):
        try:
            return Job.objects.filter(pk__in=job_ids).exclude(state__in=Job.FINISHED_STATES).exists()
        except OperationalError:
            close_old_connections()
            time.sleep(2)
    return Job.objects.filter(pk__in=job_ids).exclude(state__in=Job.FINISHED_STATES).exists()  # its error ends the run


@dataclass
class _Outcome:
    """The jobs of one run, once they have all finished."""

    jobs: list = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


class _Bench:
    def __init__(self, progress: Progress, options: dict) -> None:
        self.progress = progress
        self.options = options
        self.owner = bench_user(BENCH_USERNAME)
        self.other = bench_user(f"{BENCH_USERNAME}-2")  # the second user of the fairness phase
        self.rng = synthetic_rng(options["seed"])
        self.engine_process: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.worker_layout: str | None = None
        self.socket = Path(options["engine_socket"] or Path(settings.VAR_DIR) / "bench" / "engine.sock")
        self.log_dir = Path(settings.VAR_DIR) / "bench" / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.scale = 1.0
        self.broker_refusals = 0
        self._documents = 0
        self.best_engine: dict[str, str] = {}  # workload -> the tuned engine mode its first repeat found
        self.variants = variants(options.get("variants") or "")  # mode -> the scheduler settings it changes
        self._variant_defaults: dict[str, Any] | None = None
        self.ingest_worker: Any = None  # measure.ingest_throughput.Worker, started by the ingest phase
        self.calibration: dict = {}  # what ``calibrate`` measured and chose

    # --- processes ------------------------------------------------------------------------

    def _env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "APPLIANCE_ENGINE_SOCKET": str(self.socket),
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            **extra,
        }

    def client(self):
        from inference.engine.client import EngineClient

        return EngineClient(self.socket, connect_timeout_s=5.0)

    def engine_stats(self) -> dict:
        return self.client().stats()

    def start_engine(self) -> None:
        if self.options["engine_socket"]:
            self.progress(f"using the engine host at {self.socket}")
        else:
            self._refuse_if_engine_listening()
            capacity = self.options["kv_capacity_tokens"]
            if capacity is None:
                capacity = 0 if _has_cuda() else 24576
            self.progress(
                f"starting an engine host (KV capacity {capacity if capacity else 'all'} tokens); this takes a minute or two"
            )
            (self.log_dir / "engine.log").unlink(missing_ok=True)
            self.engine_process = start_logged(
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "engine_host"],
                # This host serves the benchmark's own operations (set_scheduling and the rest).
                env=self._env(APPLIANCE_KV_CAPACITY_TOKENS=str(capacity), APPLIANCE_ENGINE_BENCHMARK_OPS="1"),
                log_path=self.log_dir / "engine.log",
            )
        stats = wait_for_engine(self.socket, process=self.engine_process, log_path=self.log_dir / "engine.log")
        if self.options["engine_socket"]:
            self._require_benchmark_operations()
        scale = self.options["scale"]
        self.scale = stats["max_model_len"] / 8192 if scale == "auto" else float(scale)
        self.progress(
            f"engine: {stats['model']} on {stats['device_name']}, context {stats['max_model_len']}, "
            f"KV capacity {stats['kv_capacity_tokens']} tokens; lengths scaled by {self.scale:g}"
        )

    def _require_benchmark_operations(self) -> None:
        """A host of someone else's serves the benchmark's operations only if it was started for
        benchmarks: say so now, not halfway through a run."""
        from inference.engine.client import EngineRequestError
        from inference.engine.protocol import ErrorCode

        try:
            self.client().set_scheduling(None)
        except EngineRequestError as exc:
            if exc.code == ErrorCode.FORBIDDEN:
                raise CommandError(
                    f"the engine host at {self.socket} does not serve benchmark operations: start it with "
                    "APPLIANCE_ENGINE_BENCHMARK_OPS=1, or leave out --engine-socket to let the benchmark start its own"
                ) from None
            raise

    def _refuse_if_engine_listening(self) -> None:
        """An engine host already on the benchmark's socket (an interrupted run's) would answer
        in place of the one started here, with its own settings."""
        from inference.engine.client import EngineClient

        try:
            pid = EngineClient(self.socket, connect_timeout_s=1.0).stats().get("pid")
        except Exception:  # noqa: BLE001 - nothing listening: as it should be
            return
        raise CommandError(
            f"An engine host (pid {pid}) is already listening at {self.socket}, perhaps left by an interrupted "
            "run: stop it, or pass --engine-socket to measure that one."
        )

    def _workers(self, layout: str, *, prefill: int | None = None, decode: int | None = None) -> None:
        """Worker pools as `make run` starts them: ``split`` (a prefill and a decode pool) or
        ``fifo`` (one pool on one queue, for both kinds)."""
        prefill = prefill or self.options["document_pool"]
        decode = decode or self.options["draft_pool"]
        key = f"{layout}:{prefill}:{decode}"
        if self.worker_layout == key:
            return
        self._stop_workers()
        caps = SimpleNamespace(
            BASE_DIR=settings.BASE_DIR,
            APPLIANCE_INGEST_CONCURRENCY=1,
            APPLIANCE_PREFILL_CONCURRENCY=prefill + decode if layout == "fifo" else prefill,
            APPLIANCE_DECODE_CONCURRENCY=decode,
        )
        wanted = {"prefill-worker"} if layout == "fifo" else {"prefill-worker", "decode-worker"}
        env = self._env(APPLIANCE_SCHEDULING="fifo" if layout == "fifo" else "appliance")
        self.workers += start_appliance_processes(wanted, settings=caps, tag="bench", env=env, log_dir=self.log_dir)
        wait_for_queues({"prefill"} if layout == "fifo" else {"prefill", "decode"}, log_dir=self.log_dir)
        self.worker_layout = key
        self.progress(
            f"workers: {layout} (prefill pool {caps.APPLIANCE_PREFILL_CONCURRENCY}"
            + ("" if layout == "fifo" else f", decode pool {decode}")
            + ")"
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """A few jobs through pools just started (8 drafts and a summary), not measured: a
        pool's first jobs pay for what its process loads on first use and for their threads'
        first connections (database, engine host), and a phase's first drafts should not. Its
        own texts: the measured runs' stay as seeded."""
        from inference import services

        rng = random.Random(0)  # noqa: S311 - its own: the measured runs' texts stay as seeded
        document = self._document(self._tokens(300), rng=rng)
        drafts = [
            (0.0, lambda m=m: services.job_create_chat(owner=self.owner, messages=m, max_tokens=4, ignore_eos=True))
            for m in self._draft_messages(min(8, self.options["draft_pool"]), rng)
        ]
        summary = (
            0.0,
            lambda: services.job_create_summary(
                owner=self.owner, document=document, length="short", max_tokens=4, ignore_eos=True
            ),
        )
        started = time.monotonic()
        self._submit_schedule(self._current_layout_mode(), [summary, *drafts])
        self.progress(f"  warmed up with {len(drafts)} drafts and a summary in {time.monotonic() - started:.1f} s")

    def calibrate(self, phases: list[str]) -> None:
        """``--steady-rate auto`` and ``--steady-documents auto``: a steady stream that asks the
        same share of any machine (this CPU's float32 engine drafts at a fraction of a GPU's
        speed, and a fixed rate that is a busy office on one is an overload on the other, whose
        queue grows for as long as the backlog runs). Measured through the real path, under the
        appliance policy, each only when it is wanted: twice the decode pool's drafts at once
        (drafts finished a second with every decode thread busy: the drafting capacity), then
        the prefill pool's documents at once (documents a second alone; the steady and eos
        phases' backlog). Not measured in any repeat; its own texts."""
        want_rate = self.options["steady_rate"] == "auto"
        want_backlog = self.options["steady_documents"] == "auto" and bool({"steady", "eos"} & set(phases))
        if not (want_rate or want_backlog):
            return
        self._workers("split")
        self._set_mode("appliance")
        rng = random.Random(self.options["seed"] - 1)  # noqa: S311 - seeded, apart from the repeats' texts
        measured: dict[str, float] = {}
        if want_rate:
            n = 2 * self.options["draft_pool"]
            self.progress(f"calibrating the steady stream: {n} drafts at once")
            schedule = [(0.0, self._draft_factory(m)) for m in self._draft_messages(n, rng)]
            drafts = self._submit_schedule("appliance", schedule)
            measured["drafting_capacity_per_s"] = n / max(drafts.finished - drafts.started, 1e-9)
        k = self.options["document_pool"]
        if want_backlog:
            self._quiet("calibrating")
            self.progress(f"calibrating the steady backlog: {k} documents at once")
            backlog = [self._document(self._tokens(self.options["document_tokens"]), rng=rng) for _ in range(k)]
            documents = self._submit_schedule("appliance", [(0.0, self._document_factory(d)) for d in backlog])
            measured["documents_alone_per_s"] = k / max(documents.finished - documents.started, 1e-9)
        try:
            sizes = steady_sizes(capacity_per_s=measured.get("drafting_capacity_per_s"),
                                 documents_per_s=measured.get("documents_alone_per_s"),
                                 load=self.options["steady_load"], min_drafts=self.options["min_drafts"],
                                 rate=self.options["steady_rate"],
                                 documents=self.options["steady_documents"] if want_backlog else 0, at_least=k)  # fmt: skip
        except ValueError as exc:
            raise CommandError(f"calibrating the steady stream: {exc}") from None
        if not want_backlog:
            del sizes["steady_documents"]  # given, or not used by the phases asked for
        self.calibration = {
            **{name: round(value, 4) for name, value in measured.items()},
            "auto": sorted(name for name in sizes if self.options[name] == "auto"),
            **sizes,
        }
        if capacity := measured.get("drafting_capacity_per_s"):
            self.calibration["load"] = round(sizes["steady_rate"] / capacity, 3)
        self.options.update(sizes)
        self.progress(
            f"steady stream: {sizes['steady_rate']} drafts/s"
            + (
                f" ({sizes['steady_rate'] / capacity:.2f} of the {capacity:.2f}/s drafting capacity measured)"
                if capacity
                else ""
            )
            + (
                f", a backlog of {sizes['steady_documents']} documents "
                f"({measured['documents_alone_per_s'] * 60:.2f}/min alone)"
                if want_backlog
                else ""
            )
        )

    def _stop_workers(self) -> None:
        stop_groups(self.workers)
        self.workers = []
        self.worker_layout = None

    def close(self) -> None:
        from measure import ingest_throughput

        ingest_throughput.stop_worker(self.ingest_worker)
        self._stop_workers()
        if self.engine_process is not None and self.engine_process.poll() is None:
            self.progress("stopping the engine host this benchmark started")
            stop_groups([self.engine_process], timeout_s=60)
        self._delete_rows()

    def _delete_rows(self) -> None:
        from documents.models import Document
        from inference.models import Job

        for owner in (self.owner, self.other):
            Job.objects.filter(owner=owner).delete()
            Document.objects.filter(owner=owner).delete()

    # --- engine policy ----------------------------------------------------------------------

    def _set_mode(self, mode: str, *, forget_output_lengths: bool = False, **settings_: object) -> None:
        """``engine@512``: vLLM's priority scheduling with long_prefill_token_threshold 512;
        ``appliance:key=value+...``: a ``--variants`` one. Every other mode has the settings the
        variants change at the engine's own values."""
        name, _, threshold = mode.partition("@")
        client = self.client()
        changed = self.variants.get(name, {})
        if self.variants and self._variant_defaults is None:
            current = client.set_scheduling(None)["settings"]  # the engine's own, before any variant
            keys = {k for values in self.variants.values() for k in values}
            self._variant_defaults = {k: current[k] for k in keys}
        values = {**(self._variant_defaults or {}), **changed, **settings_}
        client.set_scheduling(name.partition(":")[0], forget_output_lengths=forget_output_lengths,
                              long_prefill_token_threshold=int(threshold or 0), **values)  # fmt: skip
        client.reset_prefix_cache()  # no run profits from another's cache

    @staticmethod
    def _layout(mode: str) -> str:
        return "fifo" if mode == "fifo" else "split"

    # --- workload ---------------------------------------------------------------------------

    def _tokens(self, n: int) -> int:
        return max(1, round(n * self.scale))

    def _text(self, tokens: int, rng: random.Random | None = None) -> str:
        """Contract-like text of about ``tokens`` tokens of the model's tokenizer."""
        rng = rng or self.rng
        words = max(1, int(tokens * 0.62))
        for _ in range(6):
            text = " ".join(synthetic_sentence(rng) for _ in range(max(1, words // 12)))
            measured = self.client().count_tokens([[{"role": "user", "content": text}]])[0]
            if abs(measured - tokens) <= max(8, tokens * 0.03):
                return text
            words = max(1, int(words * tokens / max(measured, 1)))
        return text

    def _document(self, tokens: int, owner=None, rng: random.Random | None = None):
        """A ready document of about ``tokens`` prompt tokens (text stored as pages, no file)."""
        from documents.models import Document, Page

        text = self._text(tokens, rng)
        self._documents += 1
        pages = [text[i : i + 3000] for i in range(0, len(text), 3000)]
        document = Document.objects.create(
            owner=owner or self.owner,
            title=f"Benchmark contract {self._documents}",
            filename=f"bench-{self._documents}.txt",
            kind=Document.Kind.TEXT,
            size_bytes=len(text.encode()),
            sha256=hashlib.sha256(f"{self._documents}:{text}".encode()).hexdigest(),
            file="",
            state=Document.State.READY,
            pages_total=len(pages),
            pages_done=len(pages),
        )
        offset = 0
        Page.objects.bulk_create(
            [
                Page(document=document, number=i + 1, text=page, char_start=(offset := offset + len(page)) - len(page))
                for i, page in enumerate(pages)
            ]
        )
        return document

    def _documents_for(self, n: int) -> list:
        return [self._document(self._tokens(self.options["document_tokens"])) for _ in range(n)]

    def _draft_messages(self, n: int, rng: random.Random) -> list[list[dict[str, str]]]:
        tokens = self._tokens(self.options["draft_tokens"])
        return [
            [{"role": "user", "content": f"Draft a reply. {self._text(max(1, tokens - 30), rng)}"}] for _ in range(n)
        ]

    def _draft_factory(self, messages, *, eos: bool = False):
        from inference import services

        output = self._tokens(self.options["draft_output"]) if not eos else 256
        return lambda: services.job_create_chat(
            owner=self.owner, messages=messages, max_tokens=output, ignore_eos=not eos
        )

    def _document_factory(self, document, *, eos: bool = False, owner=None):
        from inference import services

        output = self._tokens(self.options["document_output"]) if not eos else None
        return lambda: services.job_create_summary(
            owner=owner or self.owner, document=document, length="short", max_tokens=output, ignore_eos=not eos
        )

    def _create(self, factory):
        """Create a job as the benchmark may (no queue caps: it measures the engine, not them).
        A job refused because the broker did not answer is asked for again, as a client told to
        retry would (a few times, a second apart), and counted (``broker_refusals``): one such
        refusal ended a 20-minute run before."""
        from django.db import close_old_connections

        from appliance.broker import BrokerUnavailable

        try:
            for attempt in range(CREATE_ATTEMPTS):
                try:
                    with override_settings(APPLIANCE_MAX_QUEUE_DEPTH=10**6, APPLIANCE_MAX_QUEUED_PER_USER=10**6):
                        return factory()
                except BrokerUnavailable:
                    self.broker_refusals += 1
                    self.progress(f"the broker did not answer a job's creation ({self.broker_refusals} so far)")
                    if attempt == CREATE_ATTEMPTS - 1:
                        raise
                    time.sleep(1.0)
        finally:
            close_old_connections()

    def _submit_schedule(self, mode: str, schedule: list[tuple[float, object]]) -> _Outcome:
        """Create jobs at their offsets from now (``schedule`` of (seconds, factory)), wait for
        all to finish, and return them with their metrics."""
        outcome = _Outcome(started=time.time())
        created: list = [None] * len(schedule)
        errors: list[BaseException] = []

        def submit(index: int, at: float, factory) -> None:
            try:
                delay = outcome.started + at - time.time()
                if delay > 0:
                    time.sleep(delay)
                created[index] = self._create(factory)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=submit, args=(i, at, f)) for i, (at, f) in enumerate(schedule)]
        with _scheduling_settings(mode):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise CommandError(f"could not create a job: {errors[0]}")
        outcome.jobs = self._wait([job.pk for job in created])
        outcome.finished = max(job.finished_at.timestamp() for job in outcome.jobs)
        return outcome

    def _wait(self, ids: list, *, allow_failures: bool = False) -> list:
        from inference.models import Job

        deadline = time.monotonic() + self.options["timeout"]
        while Job.objects.filter(pk__in=ids).exclude(state__in=Job.FINISHED_STATES).exists():
            if time.monotonic() > deadline:
                raise CommandError(f"jobs did not finish within {self.options['timeout']:.0f} s")
            time.sleep(0.2)
        jobs = list(Job.objects.filter(pk__in=ids).select_related("metrics"))
        order = {pk: i for i, pk in enumerate(ids)}
        jobs.sort(key=lambda job: order[job.pk])
        failed = [job for job in jobs if job.state != Job.State.SUCCEEDED]
        if failed and not allow_failures:
            raise CommandError(f"{len(failed)} job(s) did not succeed, e.g. {failed[0].state}: {failed[0].error}")
        return jobs

    # --- one repeat -------------------------------------------------------------------------

    def repeat(self, index: int, phases: list[str], thresholds: list[int], *, into: dict,
               saved: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        """One repeat of each phase asked for, each phase's figures put ``into`` the dict given
        as soon as it ends (``saved`` then writes what the run has so far)."""
        seed = self.options["seed"] + 1000 * index
        runs: dict[str, Callable[[], dict]] = {
            "burst": lambda: self.drafting_beside_documents("burst", seed, thresholds),
            "steady": lambda: self.drafting_beside_documents("steady", seed, thresholds),
            "eos": lambda: self.drafting_beside_documents("eos", seed, []),
            "idle": lambda: self.idle(seed),
            "peak": lambda: self.peak(seed),
            "fairness": self.fairness,
            "prefix": self.prefix_reuse,
            "ingest": lambda: self.beside_ingest(seed),
        }
        for phase in PHASES:
            if phase in phases:
                into[phase] = runs[phase]()
                saved()

    def _modes(self, workload: str, thresholds: list[int]) -> list[str]:
        appliance = ["appliance", *(self.variants if workload in ("burst", "steady") else ())]
        if workload in self.best_engine:
            return [*appliance, "fifo", self.best_engine[workload]]
        return [*appliance, "fifo", *(f"engine@{t}" for t in thresholds)]  # the sweep, on the first repeat

    def drafting_beside_documents(self, workload: str, seed: int, thresholds: list[int]) -> dict:
        """Drafting alone, then beside a document backlog under each policy, with the same
        arrivals and the same kind of text for every policy (seeded)."""
        eos = workload == "eos"
        self._workers("split")
        self._set_mode("appliance")
        self.progress(f"{workload}: drafting alone")
        alone = self._drafting_run(workload, seed, documents=None, eos=eos)
        self.progress(f"{workload}: {len(alone['drafts'])} drafts alone")
        result: dict[str, Any] = {"alone": drafting_figures(alone["drafts"]), "modes": {}}
        for mode in self._modes(workload, thresholds):
            self._workers(self._layout(mode))
            self._set_mode(mode)
            self.progress(f"{workload} [{mode}]: drafting beside documents")
            run = self._drafting_run(workload, seed, documents=True, eos=eos)
            figures = {
                "drafting": drafting_figures(run["drafts"]),
                "documents": document_figures(run["documents"], run["started"]),
                "episodes": run["episodes"],
            }
            figures["ttft_p95_ratio"] = _ratio(figures["drafting"]["ttft_p95_ms"], result["alone"]["ttft_p95_ms"])
            figures["itl_p95_ratio"] = _ratio(figures["drafting"]["itl_p95_ms"], result["alone"]["itl_p95_ms"])
            if mode.startswith("appliance"):
                figures["scheduler"] = self.engine_stats().get("scheduler", {})
            result["modes"][mode] = figures
            self.progress(
                f"{workload} [{mode}]: TTFT p95 x{figures['ttft_p95_ratio']}, ITL p95 x{figures['itl_p95_ratio']}, "
                f"{figures['documents']['documents_per_minute']} documents/min, "
                f"{figures['drafting']['requests']} drafts measured"
            )
            if steps := _step_times_line(figures.get("scheduler", {})):
                self.progress(f"{workload} [{mode}]: steps by plan, p50 / p95 ms (p95 over the cost model): {steps}")
        fifo = result["modes"]["fifo"]["documents"]["documents_per_minute"]
        for figures in result["modes"].values():
            figures["documents_vs_fifo"] = _ratio(figures["documents"]["documents_per_minute"], fifo)
            figures["meets_drafting_bounds"] = bool(
                figures["ttft_p95_ratio"] is not None
                and figures["ttft_p95_ratio"] <= TARGETS["ttft_ratio"]
                and figures["itl_p95_ratio"] is not None
                and figures["itl_p95_ratio"] <= TARGETS["itl_ratio"]
            )
        engine_modes = {m: f for m, f in result["modes"].items() if m.startswith("engine@")}
        if engine_modes:
            result["engine_best"] = self.best_engine.setdefault(workload, _best_engine(engine_modes))
        if "appliance" in result["modes"] and workload != "eos":
            result["bound"] = self._documents_bound(result)
        return result

    def _drafting_run(self, workload: str, seed: int, *, documents: bool | None, eos: bool) -> dict:
        """``burst``: episodes of (backlog + a burst of drafts) until ``min_drafts`` drafts;
        ``steady``/``eos``: one backlog and Poisson drafts for as long as it runs (alone: for as
        long as twice ``min_drafts`` take to arrive)."""
        rng = random.Random(seed)  # noqa: S311 - the same arrivals and prompts for every policy
        if workload == "burst":
            drafts: list = []
            docs: list = []
            episodes = 0
            started = time.time()
            while len(drafts) < self.options["min_drafts"]:
                n = self.options["burst_drafts"]
                messages = self._draft_messages(n, rng)
                schedule = [
                    (i * self.options["burst_interval"], self._draft_factory(m, eos=eos))
                    for i, m in enumerate(messages)
                ]
                backlog = self._documents_for(self.options["documents"]) if documents else []
                schedule = [(0.0, self._document_factory(d, eos=eos)) for d in backlog] + schedule
                outcome = self._submit_schedule(self._current_layout_mode(), schedule)
                docs += outcome.jobs[: len(backlog)]
                drafts += outcome.jobs[len(backlog) :]
                episodes += 1
            return {"drafts": drafts, "documents": docs, "started": started, "episodes": episodes}
        # Alone, twice --min-drafts: the denominator of every ratio rests on about as many
        # requests as the runs beside a backlog (100-150 at the defaults), not on its 4 slowest.
        alone = None if documents else 2 * self.options["min_drafts"]
        return self._steady_run(rng, documents=bool(documents), eos=eos, drafts_wanted=alone)

    def _current_layout_mode(self) -> str:
        return "fifo" if self.worker_layout and self.worker_layout.startswith("fifo") else "appliance"

    def _steady_run(self, rng: random.Random, *, documents: bool, eos: bool, drafts_wanted: int | None = None) -> dict:

        rate = self.options["steady_rate"]
        backlog = self._documents_for(self.options["steady_documents"]) if documents else []
        drafts_created: list = []
        started = time.time()
        with _scheduling_settings(self._current_layout_mode()):
            document_ids = [self._create(self._document_factory(d, eos=eos)).pk for d in backlog]
            next_at = started + rng.expovariate(rate)
            backlog_done_at = None
            while True:
                now = time.time()
                if documents and backlog_done_at is None and not _unfinished(document_ids):
                    backlog_done_at = now
                if documents and backlog_done_at is not None:
                    break
                if not documents and len(drafts_created) >= (drafts_wanted or self.options["min_drafts"]):
                    break
                if now - started > self.options["timeout"]:
                    raise CommandError(f"the backlog did not finish within {self.options['timeout']:.0f} s")
                if now >= next_at:
                    messages = self._draft_messages(1, rng)[0]
                    drafts_created.append((now, self._create(self._draft_factory(messages, eos=eos)).pk))
                    next_at += rng.expovariate(rate)
                time.sleep(max(0.0, min(0.1, next_at - time.time())))
        drafts = self._wait([pk for _, pk in drafts_created])
        docs = self._wait(document_ids)
        if documents:
            # Only the drafts that arrived while documents were still running.
            drafts = [job for (at, _), job in zip(drafts_created, drafts, strict=True) if at <= backlog_done_at]
            if len(drafts) < self.options["min_drafts"]:
                self.progress(
                    f"  only {len(drafts)} drafts arrived while the backlog ran (fewer than --min-drafts "
                    f"{self.options['min_drafts']}): raise --steady-documents or --steady-rate"
                )
        return {"drafts": drafts, "documents": docs, "started": started, "episodes": 1}

    def _documents_bound(self, result: dict) -> dict:
        """How fast documents could go within the drafting ITL target, from the step costs the
        scheduler measured on this machine: each step may hold what the target leaves beside
        the drafters' decode tokens."""
        from inference.engine.step_policy import StepCostModel, StepShape

        scheduler = result["modes"]["appliance"].get("scheduler", {})
        cost = scheduler.get("cost_model", {})
        if not cost.get("fitted"):
            return {"available": False}
        model = StepCostModel.from_coefficients(tuple(cost[name] for name in StepCostModel.FEATURES))
        drafting = result["modes"]["appliance"]["drafting"]
        # Drafters in the engine at once (Little's law): arrivals/s x time each spends there.
        draft_s = (drafting.get("ttft_p50_ms") or 0) / 1000 + (drafting.get("itl_mean_ms") or 0) / 1000 * drafting.get(
            "output_tokens_mean", 0
        )
        episodes_s = result["modes"]["appliance"]["documents"]["elapsed_s"]
        concurrency = max(1, round(drafting["requests"] / max(episodes_s, 1e-9) * draft_s))
        context = self._tokens(self.options["draft_tokens"]) + self._tokens(self.options["draft_output"]) // 2
        base = StepShape.of([context] * concurrency, [])
        decode_step_s = model.predict(base) or 0.0  # fitted: a number
        config = scheduler.get("config", {})
        target = (
            config["itl_target_ms"] / 1000
            if config.get("itl_target_ms")
            else decode_step_s * float(config.get("itl_slowdown", 1.4))
        )
        position = self._tokens(self.options["document_tokens"]) // 2
        bound_tokens_per_s, per_step = self._tokens_beside_drafting(model, config, scheduler, base, target, position)
        fifo_tokens_per_s = result["modes"]["fifo"]["documents"]["prompt_tokens_per_s"]
        while_drafting = _ratio(bound_tokens_per_s, fifo_tokens_per_s)
        # Bursts leave time with nobody drafting, where documents may go at FIFO's speed less
        # the 2 % rule's loss, or, drafting being recent, in steps no longer than the gap step
        # the TTFT target allows (``Planner.gap_step_s``), whose fixed cost is paid more often:
        # the bound is the mix, weighted by how long drafting was present.
        share = min(1.0, (drafting.get("busy_s") or episodes_s) / max(episodes_s, 1e-9))
        idle_speed = 1.0 - float(config.get("idle_throughput_loss", 0.02))
        gap = _ratio(self._gap_tokens_per_s(model, config, scheduler, position), fifo_tokens_per_s)
        if gap is not None:
            idle_speed = min(idle_speed, gap)
        mixed = None if while_drafting is None else _round((1 - share) * idle_speed + share * while_drafting, 4)
        return {
            "available": True,
            "drafters_in_engine": concurrency,
            "target_step_ms": round(target * 1000, 2),
            "decode_step_ms": round(decode_step_s * 1000, 2),
            "document_tokens_per_step": round(per_step, 1),
            "document_tokens_per_s": _round(bound_tokens_per_s),
            "drafting_share": round(share, 3),
            "idle_vs_fifo": _round(idle_speed, 4),
            "vs_fifo_while_drafting": while_drafting,
            "vs_fifo": mixed,
        }

    @staticmethod
    def _planner(model, config: dict, scheduler: dict, max_budget_tokens: int = 2048):
        """A planner with the engine's scheduler settings and fitted step costs: what its rules
        give on this machine, worked out here rather than copied."""
        from inference.engine.step_policy import Planner, PolicyConfig

        known = set(PolicyConfig().to_dict())
        policy = PolicyConfig.from_dict({k: v for k, v in config.items() if k in known})
        return Planner(config=policy, max_budget_tokens=max_budget_tokens, cost=model,
                       default_draft_prompt_tokens=int(scheduler.get("draft_prompt_tokens") or 64))  # fmt: skip

    @staticmethod
    def _tokens_beside_drafting(model, config: dict, scheduler: dict, base, target: float, position: int,
                                steps: int = 64) -> tuple[float | None, float]:  # fmt: skip
        """Documents' prompt tokens a second, and a step, beside the drafting work ``base``:
        ``steps`` steps of the planner's own rule for them (``Planner.pooled_document_budget``:
        the 4 tokens documents always read at their cost, saved up into one chunk where a chunk's
        fixed cost is large, bounded by what drafters felt alone at p95, ``drafting_step_p95_ms``),
        timed by the measured step costs. Documents' floor is not in it (it gives them more
        where this is little)."""
        from inference.engine.step_policy import StepShape

        if target <= 0 or not model.prices_prefill:
            return None, 0.0
        planner = _Bench._planner(model, config, scheduler)
        if felt_ms := scheduler.get("drafting_step_p95_ms"):
            for _ in range(planner.min_drafting_steps):
                planner.note_step(felt_ms / 1000, drafting_only=True)
        tokens = seconds = 0.0
        for _ in range(steps):
            n = planner.pooled_document_budget(base, position, target_s=target)
            step = StepShape(base.decode_requests, base.decode_context_tokens, base.prefill_tokens + n,
                             base.prefill_attention + n * (position + n / 2))  # fmt: skip
            tokens, seconds = tokens + n, seconds + (model.predict(step) or 0.0)
        return tokens / seconds, tokens / steps

    def _gap_tokens_per_s(self, model, config: dict, scheduler: dict, position: int) -> float | None:
        """Documents' prompt tokens a second in steps of the gap step between drafters
        (``Planner.gap_step_s``, on the measured step costs), to set beside FIFO's measured speed
        (the cost model, fitted on the short steps the scheduler plans, is not read for FIFO's
        steps of the whole budget); None when there is no gap step (``drafting_recent_s`` 0) or
        the model cannot tell."""
        from inference.engine.step_policy import StepShape

        budget = int(self.engine_stats().get("max_num_batched_tokens") or 0)
        planner = self._planner(model, config, scheduler, budget or 2048)
        if not planner.config.drafting_recent_s:
            return None
        gap_s = planner.gap_step_s()
        tokens = model.prefill_budget(StepShape(), position=position, target_s=gap_s) if gap_s else None
        return tokens / gap_s if tokens and gap_s else None

    def beside_ingest(self, seed: int) -> dict:
        """Steady drafting (Poisson at ``--steady-rate``) in ``--ingest-pairs`` pairs of windows,
        one with nothing else running and one while an ingest backlog (``--ingest-pages`` pages
        of PDFs, queued at the start) goes through the ingest worker as ``make run`` starts it.
        Between windows the worker is held still (``appliance.processes.held``): the two sides of
        a pair see the same arrivals and the same stretch of time, and the order alternates
        (alone first, then ingest first), so a machine that drifts between windows weighs on both
        sides. ``--min-drafts`` drafts per side, shared among the pairs. What is left of the
        backlog at the end is cancelled."""
        from measure import ingest_throughput

        self._workers("split")
        self._set_mode("appliance")
        if self.ingest_worker is None:  # started (and idle) before: its start-up is in neither side
            self.ingest_worker = ingest_throughput.start_worker(
                self.progress, self.log_dir, env={"APPLIANCE_ENGINE_SOCKET": str(self.socket)}
            )
        worker = self.ingest_worker
        pairs = max(1, self.options["ingest_pairs"])
        per_window = -(-self.options["min_drafts"] // pairs)
        document_pages = 20
        n = max(1, self.options["ingest_pages"] // document_pages)
        ids = ingest_throughput.create_documents(
            self.owner, ingest_throughput.make_pdfs(n, document_pages, seed), f"ingest-{seed}"
        )
        sides: dict[str, list] = {"alone": [], "beside_ingest": []}
        seconds = {"alone": 0.0, "beside_ingest": 0.0}
        pair_ratios: list[dict] = []
        pages_read = 0
        with held(worker.processes):
            ingest_throughput.queue(ids)
            for index in range(pairs):
                order = ("alone", "beside_ingest") if index % 2 == 0 else ("beside_ingest", "alone")
                window: dict[str, list] = {}
                for side in order:
                    arrivals = random.Random(seed * 1000 + index)  # noqa: S311 - seeded; both sides the same
                    self.progress(f"ingest: pair {index + 1}/{pairs}, {per_window} drafts {side.replace('_', ' ')}")
                    pages_before, started = ingest_throughput.pages_done(ids), time.time()
                    with ingest_throughput.reading(worker) if side == "beside_ingest" else contextlib.nullcontext():
                        run = self._steady_run(arrivals, documents=False, eos=False, drafts_wanted=per_window)
                    seconds[side] += time.time() - started
                    pages_read += ingest_throughput.pages_done(ids) - pages_before
                    window[side] = run["drafts"]
                    sides[side] += run["drafts"]
                alone, beside = drafting_figures(window["alone"]), drafting_figures(window["beside_ingest"])
                pair_ratios.append({
                    "order": list(order),
                    "ttft_p95_ratio": _ratio(beside["ttft_p95_ms"], alone["ttft_p95_ms"]),
                    "itl_p95_ratio": _ratio(beside["itl_p95_ms"], alone["itl_p95_ms"]),
                })  # fmt: skip
        ingest_s = seconds["beside_ingest"]
        unfinished = ingest_throughput.unfinished(ids).count()
        ingest_throughput.cancel(self.owner, ids)  # the rest of the backlog; the next phase starts on an idle worker
        if not unfinished:
            self.progress("  the backlog ended before the last window: raise --ingest-pages")
        result: dict[str, Any] = {
            "alone": drafting_figures(sides["alone"]),
            "beside_ingest": drafting_figures(sides["beside_ingest"]),
            "pairs": pair_ratios,
            "ingest_pages_read": pages_read,
            "ingest_pages_per_s": _round(pages_read / ingest_s, 2) if ingest_s else None,
            "backlog_ran_throughout": bool(unfinished),
        }
        result["ttft_p95_ratio"] = _ratio(result["beside_ingest"]["ttft_p95_ms"], result["alone"]["ttft_p95_ms"])
        result["itl_p95_ratio"] = _ratio(result["beside_ingest"]["itl_p95_ms"], result["alone"]["itl_p95_ms"])
        self.progress(
            f"ingest: TTFT p95 x{result['ttft_p95_ratio']}, ITL p95 x{result['itl_p95_ratio']} beside "
            f"{result['ingest_pages_per_s']} pages/s of ingest ({result['beside_ingest']['requests']} drafts a side; "
            f"per pair TTFT {[p['ttft_p95_ratio'] for p in pair_ratios]})"
        )
        return result

    def _quiet(self, phase: str) -> None:
        """No drafting traffic means none lately either: the scheduler keeps steps short for
        drafting_recent_s after the last drafter (an earlier phase's, or a warm-up's)."""
        quiet_s = float(self.engine_stats().get("scheduler", {}).get("config", {}).get("drafting_recent_s", 0))
        if quiet_s:
            self.progress(
                f"{phase}: waiting {quiet_s:.0f} s, the scheduler's drafting_recent_s, after the last drafter"
            )
            time.sleep(quiet_s + 1)

    def idle(self, seed: int) -> dict:
        """The backlog alone: through the appliance, then the same prompts straight on the
        engine under vLLM's own scheduling."""
        from inference.engine.protocol import GenerateRequest, Priority
        from inference.prompts import section_messages, summary_instruction
        from inference.summarise import split_sections

        self._workers("split")
        self._set_mode("appliance")
        self._quiet("idle")
        n = self.options["documents"]
        output = self._tokens(self.options["document_output"])
        self.progress(f"idle: {n} documents alone through the appliance")
        backlog = self._documents_for(n)
        outcome = self._submit_schedule("appliance", [(0.0, self._document_factory(d)) for d in backlog])
        appliance = document_figures(outcome.jobs, outcome.started)
        engine_done = last_token_at(outcome.jobs)
        appliance["last_token_s"] = round(engine_done - outcome.started, 2) if engine_done else None

        self.progress(f"idle: {n} other documents of the same size straight on the engine (raw vLLM)")
        self._set_mode("fifo")
        context = int(self.engine_stats()["max_model_len"])
        requests = []
        for i, document in enumerate(self._documents_for(n)):
            from inference.prompts import PageText

            pages = [PageText(p.number, p.text) for p in document.pages.order_by("number")]
            sections = split_sections(
                title=document.title, pages=pages, context_tokens=context, count_many=self.client().count_tokens
            )
            messages = section_messages(
                title=document.title, pages=list(sections[0].pages), instruction=summary_instruction(length="short")
            )
            requests.append(
                GenerateRequest(f"bench-raw-{seed}-{i}", messages, output, Priority.PREFILL, ignore_eos=True)
            )
        direct = self.client().run_direct(requests, timeout_s=self.options["timeout"])
        raw_per_minute = n / direct["elapsed_s"] * 60
        result = {
            "appliance": appliance,
            "raw": {"documents": n, "elapsed_s": direct["elapsed_s"], "documents_per_minute": round(raw_per_minute, 3)},
            "vs_raw": _ratio(appliance["documents_per_minute"], raw_per_minute),
            # Up to the last token only (without the summaries' checks and storing after it):
            # how much of the gap is the engine's scheduling, how much the product's own work.
            "vs_raw_to_last_token": _ratio(direct["elapsed_s"], appliance["last_token_s"]),
        }
        self.progress(
            f"idle: appliance {appliance['documents_per_minute']} vs raw {round(raw_per_minute, 3)} documents/min = x{result['vs_raw']}"
        )
        return result

    def peak(self, seed: int) -> dict:
        """A burst whose KV demand is ``peak_factor`` times the capacity, sent at once."""
        rng = random.Random(seed + 7)  # noqa: S311
        capacity = int(self.engine_stats()["kv_capacity_tokens"])
        prompt, output = self._tokens(self.options["peak_prompt_tokens"]), self._tokens(self.options["peak_output"])
        wanted = self.options["peak_factor"] * capacity
        messages, demand = [], 0
        while demand < wanted:
            message = [{"role": "user", "content": f"Draft a reply to this letter. {self._text(prompt, rng)}"}]
            demand += self.client().count_tokens([message])[0] + output
            messages.append(message)
        asked, source = self._real_asks(prompt, output, wanted, rng)
        learns_from = OutputLengths().min_samples  # outputs the predicted reservation needs first
        if len(asked) < learns_from:
            self.progress(
                f"peak: only {len(asked)} EOS requests: the predicted reservation learns from "
                f"{learns_from} and reserves the max until then (raise --peak-factor)"
            )
        result: dict[str, Any] = {
            "requests": len(messages),
            "kv_capacity_tokens": capacity,
            "demand_over_capacity": round(demand / capacity, 2),
            "eos_requests": len(asked),
            "predicted_can_learn": len(asked) >= learns_from,
            "eos_text": source,
        }
        runs = [("fixed", "appliance", "max"), ("fixed", "engine", "max"), ("eos", "appliance", "max"),
                ("eos", "appliance", "predicted")]  # fmt: skip
        for lengths, mode, reservation in runs:
            key = f"{lengths}:{mode}" + (f":{reservation}" if mode == "appliance" else "")
            batch = asked if lengths == "eos" else messages
            self.progress(f"peak [{key}]: {len(batch)} requests at once against {capacity} KV tokens")
            # The prediction is the recent outputs' 90th percentile: the EOS runs start from a
            # history of their own workload alone (the max run's outputs, for the predicted run).
            result[key] = self._peak_run(
                batch, mode=mode, reservation=reservation, output=output, eos=lengths == "eos",
                forget_output_lengths=key == "eos:appliance:max",
            )  # fmt: skip
            self.progress(
                f"peak [{key}]: {result[key]['failed']} failed, {result[key]['preemptions']} preemptions, "
                f"KV use max {result[key]['kv_usage_max']}, {result[key]['requests_per_minute']} requests/min"
            )
        self._set_mode("appliance", reservation=str(settings.APPLIANCE_KV_RESERVATION))
        return result

    def _real_asks(self, prompt: int, output: int, wanted: float, rng: random.Random) -> tuple[list, str]:
        """Requests whose answers end where the model ends them: each one of ``REAL_ASKS`` about a
        passage of real text (``real_paragraphs``) of about ``prompt`` tokens, until their KV
        demand at their maximum output reaches ``wanted``. Synthetic text where no real text is
        at hand (said in the result)."""
        paragraphs = real_paragraphs()
        messages: list = []
        demand = 0
        while demand < wanted:
            ask = REAL_ASKS[len(messages) % len(REAL_ASKS)]
            if paragraphs:
                text = real_passage(paragraphs, rng.randrange(len(paragraphs)), words=max(1, int(prompt * 0.7)))
            else:
                text = self._text(prompt, rng)
            message = [{"role": "user", "content": f"{ask}\n\n{text}"}]
            demand += self.client().count_tokens([message])[0] + output
            messages.append(message)
        return messages, (str(REAL_TEXT_DIR) if paragraphs else "synthetic")

    def _peak_run(self, messages: list, *, mode: str, reservation: str, output: int, eos: bool,
                  forget_output_lengths: bool = False) -> dict:  # fmt: skip
        from inference import services

        self._workers("split", decode=len(messages))
        self._set_mode(mode, reservation=reservation, forget_output_lengths=forget_output_lengths)
        before = self.engine_stats()
        usage: list[float] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.5):
                try:
                    usage.append(float(self.engine_stats()["kv_usage"]))
                except Exception:  # noqa: S112 - a missed sample is fine
                    continue

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.time()
        try:
            with _scheduling_settings(mode):
                ids = [
                    self._create(
                        lambda m=m: services.job_create_chat(
                            owner=self.owner, messages=m, max_tokens=output, ignore_eos=not eos
                        )
                    ).pk
                    for m in messages
                ]
            jobs = self._wait(ids, allow_failures=True)
        finally:
            stop.set()
            watcher.join()
        after = self.engine_stats()
        done = [job for job in jobs if job.state == "succeeded"]
        elapsed = max((job.finished_at.timestamp() for job in jobs), default=started) - started
        return {
            "failed": len(jobs) - len(done),
            "failures": sorted({job.error[:120] for job in jobs if job.state != "succeeded"}),
            "preemptions": int(after["preemptions"]) - int(before["preemptions"]),
            "kv_usage_max": round(max(usage, default=0.0), 3),
            "elapsed_s": round(elapsed, 1),
            "requests_per_minute": round(len(done) / elapsed * 60, 2) if elapsed > 0 else None,
            "output_tokens_mean": round(statistics.mean(j.metrics.output_tokens for j in done), 1) if done else None,
            "output_tokens_p50": _round(percentile([j.metrics.output_tokens for j in done], 50)),
            "output_tokens_p90": _round(percentile([j.metrics.output_tokens for j in done], 90)),
            "at_max_tokens": sum(j.metrics.output_tokens >= output for j in done),
            "ttft_p50_ms": _round(percentile([j.metrics.ttft_ms for j in done], 50)),
            "ttft_p95_ms": _round(percentile([j.metrics.ttft_ms for j in done], 95)),
        }

    def fairness(self) -> dict:
        """One user queues ``fair_batch`` summaries; a second user then queues one. With a pool
        of two prefill workers, how many of the first user's jobs start before the second's."""
        from inference.models import Job

        self._workers("split", prefill=2)
        self._set_mode("appliance")
        batch = self.options["fair_batch"]
        tokens = self._tokens(600)
        self.progress(f"fairness: user 1 queues {batch} summaries, then user 2 one")
        first_docs = [self._document(tokens) for _ in range(batch)]
        second_doc = self._document(tokens, owner=self.other)
        with _scheduling_settings("appliance"):
            first = [self._create(self._document_factory(d)).pk for d in first_docs]
            time.sleep(0.5)  # the first user's jobs are queued, two of them already running
            second = self._create(self._document_factory(second_doc, owner=self.other)).pk
        jobs = self._wait([*first, second])
        mine = next(job for job in jobs if job.pk == second)
        theirs = [job for job in jobs if job.pk != second]
        overtaken = sum(1 for job in theirs if mine.created_at < job.started_at < mine.started_at)
        turn_s = statistics.mean((job.finished_at - job.started_at).total_seconds() for job in theirs)
        result = {
            "batch": batch,
            "first_user_jobs_started_before": overtaken,
            "second_user_wait_s": round((mine.started_at - mine.created_at).total_seconds(), 2),
            "job_turn_s": round(turn_s, 2),
            "second_user_wait_turns": round((mine.started_at - mine.created_at).total_seconds() / turn_s, 2),
            "fifo_would_wait_turns": round((batch - 2) / 2, 1),
        }
        Job.objects.filter(pk__in=[*first, second]).delete()
        self.progress(
            f"fairness: {overtaken} of user 1's jobs started between user 2's job and its start; user 2 waited "
            f"{result['second_user_wait_turns']} job turns (FIFO: about {result['fifo_would_wait_turns']})"
        )
        return result

    def prefix_reuse(self) -> dict:
        from inference import services

        self.progress("prefix reuse: a summary, then a clause extraction on the same document")
        self._workers("split")
        self._set_mode("appliance")
        self._quiet("prefix reuse")  # both of its jobs with nobody drafting lately
        document = self._document(self._tokens(self.options["prefix_tokens"]))
        first = self._submit_schedule("appliance", [(0.0, self._document_factory(document))]).jobs[0]
        clauses = (0.0, lambda: services.job_create_clauses(owner=self.owner, document=document, taxonomy="office"))
        second = self._submit_schedule("appliance", [clauses]).jobs[0]
        result = {
            "prompt_tokens": first.metrics.prompt_tokens,
            "first_prefill_ms": _round(first.metrics.prefill_ms),
            "second_prefill_ms": _round(second.metrics.prefill_ms),
            "second_cached_prompt_tokens": second.metrics.cached_prompt_tokens,
            "ratio": _ratio(second.metrics.prefill_ms, first.metrics.prefill_ms),
        }
        self.progress(
            f"prefix reuse: {result['second_prefill_ms']} ms vs {result['first_prefill_ms']} ms = x{result['ratio']}"
        )
        return result


class _scheduling_settings(override_settings):
    """The settings job creation reads under a policy (``fifo`` sends every job to one queue).
    Entered from the benchmark's main thread only: override_settings is process-wide."""

    def __init__(self, mode: str) -> None:
        super().__init__(APPLIANCE_SCHEDULING="fifo" if mode == "fifo" else "appliance")


def _best_engine(modes: dict[str, dict]) -> str:
    """The tuned baseline: the threshold that meets the drafting bounds with the most
    documents per minute; if none does, the one with the lowest drafting TTFT p95."""
    meeting = {m: f for m, f in modes.items() if f["meets_drafting_bounds"]}
    if meeting:
        return max(meeting, key=lambda m: meeting[m]["documents"]["documents_per_minute"])
    return min(modes, key=lambda m: modes[m]["ttft_p95_ratio"] or float("inf"))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --- over the repeats ---------------------------------------------------------------------------


def summarise(repeats: list[dict]) -> dict:
    """Each ratio's mean and 95 % interval over the repeats, and whether it meets its target."""
    summary: dict = {}
    for workload in ("burst", "steady", "eos"):
        runs = [r[workload] for r in repeats if workload in r]
        if not runs:
            continue
        modes = sorted({m for r in runs for m in r["modes"]}, key=lambda m: (m != "appliance", m))
        per_mode: dict[str, dict[str, Any]] = {}
        pooled_by_mode: dict[tuple[str, str], Interval | None] = {}
        for mode in modes:
            present = [r["modes"][mode] for r in runs if mode in r["modes"]]
            per_mode[mode] = {
                key: (iv.to_dict() if (iv := interval([f.get(key) for f in present])) else None)
                for key in ("ttft_p95_ratio", "itl_p95_ratio", "documents_vs_fifo")
            }
            per_mode[mode]["drafts_measured"] = [f["drafting"]["requests"] for f in present]
            for key, each in (("ttft_p95_ratio", "ttft_ms_each"), ("itl_p95_ratio", "itl_p95_ms_each")):
                pooled = pooled_ratio(
                    [r["modes"][mode]["drafting"].get(each, []) for r in runs if mode in r["modes"]],
                    [r["alone"].get(each, []) for r in runs if mode in r["modes"]],
                    _p95,
                )
                pooled_by_mode[mode, key] = pooled
                per_mode[mode][f"{key}_pooled"] = pooled.to_dict() if pooled else None
        entry: dict[str, Any] = {"modes": per_mode}
        documents_target = TARGETS["burst_documents_vs_fifo" if workload == "burst" else "steady_documents_vs_fifo"]
        appliance = [r["modes"]["appliance"] for r in runs if "appliance" in r["modes"]]
        if appliance:
            entry["verdict"] = {
                "ttft_ratio": meets(
                    interval([f["ttft_p95_ratio"] for f in appliance]), TARGETS["ttft_ratio"], below=True
                ),
                "itl_ratio": meets(interval([f["itl_p95_ratio"] for f in appliance]), TARGETS["itl_ratio"], below=True),
                "documents_vs_fifo": meets(
                    interval([f["documents_vs_fifo"] for f in appliance]), documents_target, below=False
                ),
            }
            for key, target in (("ttft_p95_ratio", "ttft_ratio"), ("itl_p95_ratio", "itl_ratio")):
                if pooled_by_mode.get(("appliance", key)):
                    entry["verdict"][f"{target}_pooled"] = meets(
                        pooled_by_mode["appliance", key], TARGETS[target], below=True
                    )
            bounds = [r.get("bound", {}) for r in runs if r.get("bound", {}).get("available")]
            if bounds:
                entry["bound_vs_fifo"] = iv.to_dict() if (iv := interval([b["vs_fifo"] for b in bounds])) else None
            best = [r.get("engine_best") for r in runs if r.get("engine_best")]
            if best and workload == "steady":
                tuned = best[-1]
                tuned_runs = [r["modes"][tuned] for r in runs if tuned in r["modes"]]
                if all(f["meets_drafting_bounds"] for f in tuned_runs):
                    gap = interval(
                        [
                            a["documents_vs_fifo"] - t["documents_vs_fifo"]
                            for a, t in zip(appliance, tuned_runs, strict=False)
                        ]
                    )
                    entry["verdict"]["documents_vs_tuned_engine"] = meets(gap, 0.0, below=False)
                else:
                    entry["verdict"]["documents_vs_tuned_engine"] = "tuned engine misses the drafting bounds"
            entry["engine_best"] = best[-1] if best else None
        summary[workload] = entry
    idle = [r["idle"] for r in repeats if "idle" in r]
    if idle:
        iv = interval([r["vs_raw"] for r in idle])
        summary["idle"] = {
            "vs_raw": iv.to_dict() if iv else None,
            "verdict": meets(iv, TARGETS["idle_vs_raw"], below=False),
            "vs_raw_to_last_token": (
                tv.to_dict()
                if (tv := interval([r["vs_raw_to_last_token"] for r in idle if r.get("vs_raw_to_last_token")]))
                else None
            ),
        }
    peaks = [r["peak"] for r in repeats if "peak" in r]
    if peaks:
        summary["peak"] = {
            key: {
                "failed": [p[key]["failed"] for p in peaks],
                "preemptions": [p[key]["preemptions"] for p in peaks],
                "requests_per_minute": (
                    iv.to_dict() if (iv := interval([p[key]["requests_per_minute"] for p in peaks])) else None
                ),
                "ttft_p95_ms": [p[key].get("ttft_p95_ms") for p in peaks],
                "output_tokens_p50": [p[key].get("output_tokens_p50") for p in peaks],
                "at_max_tokens": [p[key].get("at_max_tokens") for p in peaks],
            }
            for key in peaks[0]
            if isinstance(peaks[0][key], dict)
        }
        summary["peak"]["predicted_vs_max"] = (
            iv.to_dict()
            if (
                iv := interval(
                    [
                        _ratio(
                            p["eos:appliance:predicted"]["requests_per_minute"],
                            p["eos:appliance:max"]["requests_per_minute"],
                        )
                        for p in peaks
                    ]
                )
            )
            else None
        )
        summary["peak"]["reservation_shown"] = reservation_shown(summary["peak"])
        summary["peak"]["verdict"] = (
            "met"
            if all(
                p["fixed:appliance:max"]["failed"] == 0 and p["fixed:appliance:max"]["preemptions"] == 0 for p in peaks
            )
            else "missed"
        )
    fairness = [r["fairness"] for r in repeats if "fairness" in r]
    if fairness:
        summary["fairness"] = {
            "first_user_jobs_started_before": [f["first_user_jobs_started_before"] for f in fairness],
            "second_user_wait_turns": (
                iv.to_dict() if (iv := interval([f["second_user_wait_turns"] for f in fairness])) else None
            ),
            "verdict": "met"
            if all(f["first_user_jobs_started_before"] <= TARGETS["fairness_turns"] for f in fairness)
            else "missed",
        }
    ingest = [r["ingest"] for r in repeats if "ingest" in r]
    if ingest:
        ttft, itl = interval([r["ttft_p95_ratio"] for r in ingest]), interval([r["itl_p95_ratio"] for r in ingest])
        pages = interval([r["ingest_pages_per_s"] for r in ingest])
        ttft_pooled, itl_pooled = (
            pooled_ratio(
                [r["beside_ingest"].get(each, []) for r in ingest], [r["alone"].get(each, []) for r in ingest], _p95
            )
            for each in ("ttft_ms_each", "itl_p95_ms_each")
        )
        summary["ingest"] = {
            "ttft_p95_ratio": ttft.to_dict() if ttft else None,
            "itl_p95_ratio": itl.to_dict() if itl else None,
            "ttft_p95_ratio_pooled": ttft_pooled.to_dict() if ttft_pooled else None,
            "itl_p95_ratio_pooled": itl_pooled.to_dict() if itl_pooled else None,
            "ingest_pages_per_s": pages.to_dict() if pages else None,
            "drafts_measured": [r["beside_ingest"]["requests"] for r in ingest],
            "per_pair_ttft_p95_ratio": [p["ttft_p95_ratio"] for r in ingest for p in r.get("pairs", [])],
            "per_pair_itl_p95_ratio": [p["itl_p95_ratio"] for r in ingest for p in r.get("pairs", [])],
            "backlog_ran_throughout": all(r["backlog_ran_throughout"] for r in ingest),
            "verdict": {
                "ttft_ratio": meets(ttft, TARGETS["ingest_ratio"], below=True),
                "itl_ratio": meets(itl, TARGETS["ingest_ratio"], below=True),
                "ttft_ratio_pooled": meets(ttft_pooled, TARGETS["ingest_ratio"], below=True),
                "itl_ratio_pooled": meets(itl_pooled, TARGETS["ingest_ratio"], below=True),
            },
        }
    prefix = [r["prefix"] for r in repeats if "prefix" in r]
    if prefix:
        iv = interval([p["ratio"] for p in prefix])
        summary["prefix"] = {"ratio": iv.to_dict() if iv else None, "verdict": meets(iv, TARGETS["prefix"], below=True)}
    return summary


def _p95(values: list[float]) -> float | None:
    return percentile(values, 95)


def _fmt(entry: dict | None) -> str:
    return format_entry(entry)


def table(results: dict) -> list[str]:
    engine = results["engine"]
    summary = results["summary"]
    n = len(results["repeats"])
    lines = [
        f"Scheduling benchmark on {engine.get('device_name')} ({engine.get('model')}, context {engine.get('max_model_len')}, "
        f"KV {engine.get('kv_capacity_tokens')} tokens); {n} repeat(s), mean [95 % interval] of per-repeat ratios",
    ]
    for workload, title in (("burst", "Burst: documents at once, drafts in bursts"),
                            ("steady", "Steady: Poisson drafting for the whole backlog"),
                            ("eos", "Steady, EOS-terminated outputs")):  # fmt: skip
        entry = summary.get(workload)
        if not entry:
            continue
        width = max(14, *(len(mode) for mode in entry["modes"]))  # a --variants mode's name is long
        lines += [
            "",
            title,
            f"{'policy':<{width}} {'TTFT p95 / alone':>24} {'ITL p95 / alone':>24} {'documents / FIFO':>24} "
            f"{'drafts':>10}",
        ]
        for mode, f in entry["modes"].items():
            lines.append(
                f"{mode:<{width}} {_fmt(f['ttft_p95_ratio']):>24} {_fmt(f['itl_p95_ratio']):>24} "
                f"{_fmt(f['documents_vs_fifo']):>24} {min(f['drafts_measured']):>10}"
            )
        lines.append("pooled over the repeats' requests (bootstrap 95 % interval):")
        for mode, f in entry["modes"].items():
            if f.get("ttft_p95_ratio_pooled"):
                lines.append(
                    f"  {mode:<{width - 2}} {_fmt(f['ttft_p95_ratio_pooled']):>24} {_fmt(f['itl_p95_ratio_pooled']):>24}"
                )
        lines += _tail_lines(results["repeats"], workload)
        if entry.get("bound_vs_fifo"):
            lines.append(
                f"bound from the measured step costs within the ITL target: documents <= {_fmt(entry['bound_vs_fifo'])} x FIFO"
            )
        if entry.get("engine_best"):
            lines.append(f"tuned vLLM priority: {entry['engine_best']}")
        if entry.get("verdict"):
            lines.append("verdict (appliance): " + ", ".join(f"{k} {v}" for k, v in entry["verdict"].items()))
    if "idle" in summary:
        lines += ["", f"No drafting: documents through the appliance / raw vLLM = {_fmt(summary['idle']['vs_raw'])} "
                      f"(target >= {TARGETS['idle_vs_raw']}): {summary['idle']['verdict']}",
                  f"  up to the last token (without the summaries' checks and storing): "
                  f"{_fmt(summary['idle'].get('vs_raw_to_last_token'))}"]  # fmt: skip
    if "peak" in summary:
        lines += ["", "Peak: KV demand over capacity, all at once"]
        for key, p in summary["peak"].items():
            if isinstance(p, dict) and "failed" in p:
                lines.append(
                    f"  {key:<24} failed {p['failed']}, preemptions {p['preemptions']}, requests/min {_fmt(p['requests_per_minute'])}"
                )
        lines.append(
            f"  predicted / max reservation, requests per minute (EOS): {_fmt(summary['peak'].get('predicted_vs_max'))}"
            f"; the better default shown: {summary['peak'].get('reservation_shown')}"
        )
        for key in ("eos:appliance:max", "eos:appliance:predicted"):
            if key in summary["peak"]:
                p = summary["peak"][key]
                lines.append(f"  {key}: output tokens p50 {p.get('output_tokens_p50')}, at the maximum "
                             f"{p.get('at_max_tokens')}, TTFT p95 ms {p.get('ttft_p95_ms')}")  # fmt: skip
        lines.append(f"  verdict (no failure, no preemption under admission): {summary['peak']['verdict']}")
    if "fairness" in summary:
        f = summary["fairness"]
        lines += ["", f"Fairness: first user's jobs started before the second's single job: {f['first_user_jobs_started_before']} "
                      f"(target <= {TARGETS['fairness_turns']}); its wait in job turns {_fmt(f['second_user_wait_turns'])}: {f['verdict']}"]  # fmt: skip
    if "ingest" in summary:
        i = summary["ingest"]
        lines += [
            "",
            f"Drafting beside an ingest backlog ({_fmt(i['ingest_pages_per_s'])} pages/s read meanwhile; "
            f"{min(i['drafts_measured'])}+ drafts; backlog ran throughout: {i['backlog_ran_throughout']})",
            f"  TTFT p95 / alone {_fmt(i['ttft_p95_ratio'])}, ITL p95 / alone {_fmt(i['itl_p95_ratio'])} "
            f"(target <= {TARGETS['ingest_ratio']}): " + ", ".join(f"{k} {v}" for k, v in i["verdict"].items()),
            f"  pooled over the repeats' requests (bootstrap 95 % interval): TTFT p95 / alone "
            f"{_fmt(i.get('ttft_p95_ratio_pooled'))}, ITL p95 / alone {_fmt(i.get('itl_p95_ratio_pooled'))}",
            f"  per pair of windows (alone, beside; alternating order): TTFT {i.get('per_pair_ttft_p95_ratio')}, "
            f"ITL {i.get('per_pair_itl_p95_ratio')}",
        ]
    if "prefix" in summary:
        lines += [
            "",
            f"Prefix reuse: second job's prefill / first's = {_fmt(summary['prefix']['ratio'])} (target <= {TARGETS['prefix']}): {summary['prefix']['verdict']}",
        ]
    return lines


def _tail_lines(repeats: list[dict], workload: str) -> list[str]:
    """Per repeat, where the appliance's slowest drafters (TTFT >= p95) spent their wait."""
    lines = []
    for index, repeat in enumerate(repeats, 1):
        run = repeat.get(workload, {}).get("modes", {}).get("appliance", {})
        tail = run.get("drafting", {}).get("ttft_tail") or {}
        if tail.get("requests"):
            lines.append(
                f"  appliance repeat {index}, TTFT >= p95 ({tail['requests']} drafts, {tail['ttft_ms']} ms): "
                f"worker wait {tail['queue_wait_ms']}"
                + (f" (sent {tail['sending_ms']}, then taken {tail['taking_ms']})" if "sending_ms" in tail else "")
                + f", KV/turn wait {tail['admission_wait_ms']}, "
                f"admitted -> first token {tail['prefill_ms']}, other {tail['other_ms']} ms"
            )
    return lines


def _write_partial(results: dict) -> None:
    """What a run has measured so far, after each phase: a run stopped or failed in its third
    repeat still leaves its first two (``scheduling-partial.json``; the finished run's file is
    written by ``manage.py bench`` as for every benchmark)."""
    path = Path(settings.VAR_DIR) / "bench" / "scheduling-partial.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")


def _write_markdown(results: dict) -> None:
    path = Path(settings.VAR_DIR) / "bench" / "scheduling-latest.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("```\n" + "\n".join(table(results)) + "\n```\n")
