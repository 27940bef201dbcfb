"""``manage.py bench scheduling``: does the scheduler keep drafting fast under a document backlog?

Everything goes through the real path: jobs created by the services, Celery queues and worker
pools started as ``make run`` starts them, the engine host and the model. The engine host is one
this benchmark starts (with ``--kv-capacity-tokens`` when given), or the one at
``--engine-socket``; its policy is switched between phases, so the three policies are measured
in one run on one engine:

- ``appliance``: KV admission, drafting first, documents through the prefill lane;
- ``engine``: vLLM's priority scheduling alone (``APPLIANCE_SCHEDULING=engine``);
- ``fifo``: one queue and one pool, every request at the same priority (``APPLIANCE_SCHEDULING=fifo``).

Phases:

1. *Interference*, per policy: drafting requests alone, then the same drafting requests while a
   backlog of document jobs runs. Drafting TTFT p95 and ITL p95 with the backlog divided by the
   same alone (targets <= 3 and <= 2 for ``appliance``), and document throughput divided by
   ``fifo``'s (target >= 0.8).
2. *Overhead*: output tokens/s of a batch of chat requests through the appliance divided by the
   same requests run straight on the engine host's ``AsyncLLM`` (target >= 0.9).
3. *Peak*: a burst whose KV demand (prompt + max output tokens) is ``--peak-factor`` times the KV
   capacity, all sent at once: failures, preemptions and the highest KV usage seen.
4. *Prefix reuse*: a clause extraction on a document that was just summarised; its prefill time
   divided by the summary's (target <= 0.3). Both cut the document into the same sections, text
   first and instruction last, so the second finds the text in the prefix cache.

Lengths scale with the model's context (``--scale auto``: context / 8192), so that the same
command means the same workload on a GPU box with a real model.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from django.conf import settings
from django.core.management.base import CommandError
from django.test import override_settings

from appliance.benchmarking import (
    Progress,
    bench_user,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    machine,
    start_appliance_processes,
    start_logged,
    stop_groups,
    synthetic_rng,
    synthetic_sentence,
    wait_for_engine,
    wait_for_queues,
)
from inference.timing import percentile

HELP = "drafting latency under a document backlog (appliance vs engine vs fifo), overhead, peak, prefix reuse"

BENCH_USERNAME = "bench-scheduling"
MODES = ("appliance", "engine", "fifo")
PHASES = ("interference", "overhead", "peak", "prefix")
TARGETS = {"ttft_ratio": 3.0, "itl_ratio": 2.0, "throughput_vs_fifo": 0.8, "overhead": 0.9, "prefix": 0.3}


def add_arguments(parser) -> None:
    parser.add_argument("--modes", default=",".join(MODES), help="policies to compare, comma-separated")
    parser.add_argument("--phases", default=",".join(PHASES), help="phases to run, comma-separated")
    parser.add_argument("--scale", default="auto", help="multiply token lengths ('auto': context / 8192)")
    parser.add_argument("--documents", type=int, default=6, help="document jobs in the backlog")
    parser.add_argument("--document-tokens", type=int, default=2500, help="prompt tokens per document job")
    parser.add_argument("--document-output", type=int, default=64, help="output tokens per document job")
    parser.add_argument("--drafts", type=int, default=8, help="drafting requests")
    parser.add_argument("--draft-tokens", type=int, default=40, help="prompt tokens per drafting request")
    parser.add_argument("--draft-output", type=int, default=96, help="output tokens per drafting request")
    parser.add_argument("--draft-interval", type=float, default=0.4, help="seconds between drafting arrivals")
    parser.add_argument("--overhead-requests", type=int, default=8)
    parser.add_argument("--overhead-output", type=int, default=128)
    parser.add_argument("--peak-factor", type=float, default=4.0, help="burst KV demand / KV capacity")
    # Long enough that the engine's max_num_seqs requests at once overflow the KV cache: without
    # admission control vLLM must preempt; with it, nothing is.
    parser.add_argument("--peak-prompt-tokens", type=int, default=768)
    parser.add_argument("--peak-output", type=int, default=256)
    parser.add_argument("--peak-modes", default="appliance", help="policies the peak runs under")
    parser.add_argument("--prefix-tokens", type=int, default=6000, help="prompt tokens of the prefix-reuse document")
    parser.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="KV cache of the engine host this benchmark starts (default: 24576 on a CPU, where filling "
        "gigabytes for the peak would take hours; all of it on a GPU)",
    )
    parser.add_argument("--engine-socket", help="use the engine host already listening here instead of starting one")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds any one phase may take")
    parser.add_argument("--seed", type=int, default=20261129)


def run(command, **options) -> dict:
    def write(line: str) -> None:
        command.stdout.write(line)
        command.stdout.flush()

    progress = Progress(write)
    modes = _choices(options["modes"], MODES, "--modes")
    phases = _choices(options["phases"], PHASES, "--phases")
    peak_modes = _choices(options["peak_modes"], MODES, "--peak-modes")
    started_services = [s for s in (ensure_embedded_database(progress), ensure_embedded_broker(progress)) if s]
    bench = None
    try:
        check_migrated()
        _refuse_if_appliance_running()
        bench = _Bench(progress, options)
        bench.start_engine()
        results: dict = {
            "machine": machine(),
            "engine": {k: v for k, v in bench.engine_stats().items() if not isinstance(v, dict)},
            "parameters": {**{k: v for k, v in options.items() if k in _PARAMETERS}, "scale": bench.scale},
        }
        if "interference" in phases:
            results["interference"] = {mode: bench.interference(mode) for mode in modes}
        if "overhead" in phases:
            results["overhead"] = bench.overhead()
        if "peak" in phases:
            results["peak"] = {mode: bench.peak(mode) for mode in peak_modes}
        if "prefix" in phases:
            results["prefix"] = bench.prefix_reuse()
        _summarise(results)
        write("")
        for line in _table(results):
            write(line)
        return results
    finally:
        if bench is not None:
            bench.close()
        for service in reversed(started_services):
            progress("stopping the embedded service this benchmark started")
            service.stop()


_PARAMETERS = (
    "documents", "document_tokens", "document_output", "drafts", "draft_tokens", "draft_output", "draft_interval",
    "overhead_requests", "overhead_output", "peak_factor", "peak_prompt_tokens", "peak_output", "prefix_tokens",
    "kv_capacity_tokens", "seed",
)  # fmt: skip


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise CommandError(f"{flag}: choose from {', '.join(allowed)}")
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


@dataclass
class _Outcome:
    """The jobs of one measurement, once they have all finished."""

    jobs: list = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


class _Bench:
    def __init__(self, progress: Progress, options: dict) -> None:
        self.progress = progress
        self.options = options
        self.owner = bench_user(BENCH_USERNAME)
        self.rng = synthetic_rng(options["seed"])
        self.engine_process: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.worker_layout: str | None = None
        self.socket = Path(options["engine_socket"] or Path(settings.VAR_DIR) / "bench" / "engine.sock")
        self.log_dir = Path(settings.VAR_DIR) / "bench" / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.scale = 1.0
        self._documents = 0

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
            capacity = self.options["kv_capacity_tokens"]
            if capacity is None:
                capacity = 0 if _has_cuda() else 24576
            self.progress(
                f"starting an engine host (KV capacity {capacity if capacity else 'all'} tokens); this takes a minute or two"
            )
            (self.log_dir / "engine.log").unlink(missing_ok=True)
            self.engine_process = start_logged(
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "engine_host"],
                env=self._env(APPLIANCE_KV_CAPACITY_TOKENS=str(capacity)),
                log_path=self.log_dir / "engine.log",
            )
        stats = wait_for_engine(self.socket, process=self.engine_process, log_path=self.log_dir / "engine.log")
        scale = self.options["scale"]
        self.scale = stats["max_model_len"] / 8192 if scale == "auto" else float(scale)
        self.progress(
            f"engine: {stats['model']} on {stats['device_name']}, context {stats['max_model_len']}, "
            f"KV capacity {stats['kv_capacity_tokens']} tokens; lengths scaled by {self.scale:g}"
        )

    def _workers(self, layout: str, *, decode_concurrency: int | None = None) -> None:
        """Start worker pools as `make run` does: ``split`` (a prefill and a decode pool) or
        ``fifo`` (one pool on one queue). Concurrency lets every request of a phase in at once, so
        that what is compared is the engine host's scheduling."""
        prefill = max(self.options["documents"], 2)
        decode = decode_concurrency or max(self.options["drafts"], self.options["overhead_requests"])
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
        self.workers += start_appliance_processes(wanted, tag="bench", env=self._env(), log_dir=self.log_dir, caps=caps)
        wait_for_queues({"prefill"} if layout == "fifo" else {"prefill", "decode"}, log_dir=self.log_dir)
        self.worker_layout = key
        self.progress(
            f"workers: {layout} (prefill pool {caps.APPLIANCE_PREFILL_CONCURRENCY}"
            + ("" if layout == "fifo" else f", decode pool {decode}")
            + ")"
        )

    def _stop_workers(self) -> None:
        stop_groups(self.workers)
        self.workers = []
        self.worker_layout = None

    def close(self) -> None:
        self._stop_workers()
        if self.engine_process is not None and self.engine_process.poll() is None:
            self.progress("stopping the engine host this benchmark started")
            stop_groups([self.engine_process], timeout_s=60)
        self._delete_rows()

    def _delete_rows(self) -> None:
        from documents.models import Document
        from inference.models import Job

        Job.objects.filter(owner=self.owner).delete()
        Document.objects.filter(owner=self.owner).delete()

    # --- engine policy ----------------------------------------------------------------------

    def _set_mode(self, mode: str) -> None:
        client = self.client()
        client.set_scheduling(mode)
        client.reset_prefix_cache()  # no phase profits from another's cache

    # --- workload ---------------------------------------------------------------------------

    def _tokens(self, n: int) -> int:
        return max(1, round(n * self.scale))

    def _text(self, tokens: int) -> str:
        """Contract-like text of about ``tokens`` tokens of the model's tokenizer."""
        words = max(1, int(tokens * 0.62))
        for _ in range(6):
            text = " ".join(synthetic_sentence(self.rng) for _ in range(max(1, words // 12)))
            measured = self.client().count_tokens([[{"role": "user", "content": text}]])[0]
            if abs(measured - tokens) <= max(8, tokens * 0.03):
                return text
            words = max(1, int(words * tokens / max(measured, 1)))
        return text

    def _document(self, tokens: int):
        """A ready document of about ``tokens`` prompt tokens (text stored as pages, no file)."""
        import hashlib

        from documents.models import Document, Page

        text = self._text(tokens)
        self._documents += 1
        pages = [text[i : i + 3000] for i in range(0, len(text), 3000)]
        document = Document.objects.create(
            owner=self.owner,
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

    def _draft_messages(self, n: int) -> list[list[dict[str, str]]]:
        tokens = self._tokens(self.options["draft_tokens"])
        return [[{"role": "user", "content": f"Draft a reply. {self._text(max(1, tokens - 30))}"}] for _ in range(n)]

    def _submit_schedule(self, mode: str, schedule: list[tuple[float, object]]) -> _Outcome:
        """Create jobs at their offsets from now (``schedule`` of (seconds, factory)), wait for
        all to finish, and return them with their metrics."""
        from inference.models import Job

        outcome = _Outcome(started=time.time())
        created: list = [None] * len(schedule)
        errors: list[BaseException] = []

        def submit(index: int, at: float, factory) -> None:
            from django.db import close_old_connections

            try:
                delay = outcome.started + at - time.time()
                if delay > 0:
                    time.sleep(delay)
                created[index] = factory()
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                close_old_connections()

        threads = [threading.Thread(target=submit, args=(i, at, f)) for i, (at, f) in enumerate(schedule)]
        # Entered once, here: override_settings is process-wide and not safe to enter from threads.
        with override_settings(APPLIANCE_SCHEDULING=mode, APPLIANCE_MAX_QUEUE_DEPTH=10**6):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise CommandError(f"could not create a job: {errors[0]}")
        ids = [job.pk for job in created]
        deadline = time.monotonic() + self.options["timeout"]
        while Job.objects.filter(pk__in=ids).exclude(state__in=Job.FINISHED_STATES).exists():
            if time.monotonic() > deadline:
                raise CommandError(f"jobs did not finish within {self.options['timeout']:.0f} s")
            time.sleep(0.2)
        jobs = list(Job.objects.filter(pk__in=ids).select_related("metrics"))
        order = {pk: i for i, pk in enumerate(ids)}
        jobs.sort(key=lambda job: order[job.pk])
        failed = [job for job in jobs if job.state != Job.State.SUCCEEDED]
        if failed:
            raise CommandError(f"{len(failed)} job(s) did not succeed, e.g. {failed[0].state}: {failed[0].error}")
        outcome.jobs = jobs
        outcome.finished = max(job.finished_at.timestamp() for job in jobs)
        return outcome

    def _draft_schedule(self, messages: list) -> list:
        from inference import services

        interval = self.options["draft_interval"]
        output = self._tokens(self.options["draft_output"])
        return [
            (
                i * interval,
                lambda m=m: services.job_create_chat(owner=self.owner, messages=m, max_tokens=output, ignore_eos=True),
            )
            for i, m in enumerate(messages)
        ]

    def _document_schedule(self, documents: list, *, output: int, length: str = "short", focus: str = "") -> list:
        from inference import services

        return [
            (
                0.0,
                lambda d=d: services.job_create_summary(
                    owner=self.owner, document=d, length=length, focus=focus, max_tokens=output, ignore_eos=True
                ),
            )
            for d in documents
        ]

    # --- measurements -----------------------------------------------------------------------

    def _drafting_figures(self, jobs: list) -> dict:
        # Each request's own ITL p95 (from every token's arrival at its worker), then the p95 of
        # those across requests: the inter-token latency 95 % of drafters stay under.
        ttfts = [job.metrics.ttft_ms for job in jobs]
        itl_p95s = [job.metrics.itl_p95_ms for job in jobs if job.metrics.itl_p95_ms is not None]
        return {
            "requests": len(jobs),
            "ttft_p50_ms": _round(percentile(ttfts, 50)),
            "ttft_p95_ms": _round(percentile(ttfts, 95)),
            "itl_mean_ms": _round(statistics.mean(job.metrics.itl_mean_ms for job in jobs if job.metrics.itl_mean_ms)),
            "itl_p95_ms": _round(percentile(itl_p95s, 95)),
            "preemptions": sum(job.metrics.preemptions for job in jobs),
        }

    def interference(self, mode: str) -> dict:
        self.progress(f"interference [{mode}]: drafting alone")
        self._workers("fifo" if mode == "fifo" else "split")
        self._set_mode(mode)
        drafts = self._draft_messages(self.options["drafts"])
        alone = self._submit_schedule(mode, self._draft_schedule(drafts))
        alone_figures = self._drafting_figures(alone.jobs)

        self.progress(f"interference [{mode}]: drafting beside {self.options['documents']} document jobs")
        documents = [
            self._document(self._tokens(self.options["document_tokens"])) for _ in range(self.options["documents"])
        ]
        drafts = self._draft_messages(self.options["drafts"])
        self._set_mode(mode)
        document_output = self._tokens(self.options["document_output"])
        schedule = self._document_schedule(documents, output=document_output) + self._draft_schedule(drafts)
        backlog = self._submit_schedule(mode, schedule)
        document_jobs, draft_jobs = backlog.jobs[: len(documents)], backlog.jobs[len(documents) :]
        backlog_figures = self._drafting_figures(draft_jobs)
        documents_s = max(j.finished_at.timestamp() for j in document_jobs) - backlog.started
        result = {
            "drafting_alone": alone_figures,
            "drafting_with_backlog": backlog_figures,
            "ttft_p95_ratio": _ratio(backlog_figures["ttft_p95_ms"], alone_figures["ttft_p95_ms"]),
            "itl_p95_ratio": _ratio(backlog_figures["itl_p95_ms"], alone_figures["itl_p95_ms"]),
            "documents": len(document_jobs),
            "document_prompt_tokens_mean": round(statistics.mean(j.metrics.prompt_tokens for j in document_jobs)),
            "documents_done_s": round(documents_s, 2),
            "documents_per_minute": round(len(document_jobs) / documents_s * 60, 3),
            "document_preemptions": sum(j.metrics.preemptions for j in document_jobs),
        }
        self.progress(
            f"interference [{mode}]: TTFT p95 x{result['ttft_p95_ratio']}, ITL p95 x{result['itl_p95_ratio']}, "
            f"documents done in {result['documents_done_s']} s"
        )
        return result

    def overhead(self) -> dict:
        from inference import services
        from inference.engine.protocol import GenerateRequest, Priority

        self.progress("overhead: chat requests through the appliance, then straight on AsyncLLM")
        self._workers("split")
        self._set_mode("appliance")
        n, output = self.options["overhead_requests"], self._tokens(self.options["overhead_output"])
        messages = self._draft_messages(n)
        best_appliance = best_direct = 0.0
        for round_ in range(2):
            schedule = [
                (
                    0.0,
                    lambda m=m: services.job_create_chat(
                        owner=self.owner, messages=m, max_tokens=output, ignore_eos=True
                    ),
                )
                for m in messages
            ]
            outcome = self._submit_schedule("appliance", schedule)
            tokens = sum(job.metrics.output_tokens for job in outcome.jobs)
            best_appliance = max(best_appliance, tokens / (outcome.finished - outcome.started))
            requests = [
                GenerateRequest(f"bench-direct-{round_}-{i}", m, output, Priority.DECODE, ignore_eos=True)
                for i, m in enumerate(messages)
            ]
            direct = self.client().run_direct(requests, timeout_s=self.options["timeout"])
            best_direct = max(best_direct, direct["output_tokens"] / direct["elapsed_s"])
        result = {
            "requests": n,
            "output_tokens_each": output,
            "appliance_tokens_per_s": round(best_appliance, 2),
            "direct_tokens_per_s": round(best_direct, 2),
            "ratio": _ratio(best_appliance, best_direct),
        }
        self.progress(
            f"overhead: {result['appliance_tokens_per_s']} vs {result['direct_tokens_per_s']} tokens/s = x{result['ratio']}"
        )
        return result

    def peak(self, mode: str) -> dict:
        from inference import services

        stats = self.engine_stats()
        capacity = int(stats["kv_capacity_tokens"])
        prompt, output = self._tokens(self.options["peak_prompt_tokens"]), self._tokens(self.options["peak_output"])
        # Requests until their reservations (prompt as the engine counts it + max output) add up
        # to the factor times the capacity.
        wanted = self.options["peak_factor"] * capacity
        messages, demand = [], 0
        while demand < wanted:
            message = [{"role": "user", "content": f"Draft a reply to this letter. {self._text(prompt)}"}]
            demand += self.client().count_tokens([message])[0] + output
            messages.append(message)
        n = len(messages)
        self.progress(
            f"peak [{mode}]: {n} requests of ~{prompt} + {output} tokens at once against {capacity} KV tokens"
        )
        self._workers("split", decode_concurrency=n)
        self._set_mode(mode)
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
        schedule = [
            (
                0.0,
                lambda m=m: services.job_create_chat(owner=self.owner, messages=m, max_tokens=output, ignore_eos=True),
            )
            for m in messages
        ]
        try:
            outcome = self._submit_schedule(mode, schedule)
            failures = 0
        except CommandError as exc:
            self.progress(f"peak [{mode}]: {exc}")
            outcome, failures = None, n
        finally:
            stop.set()
            watcher.join()
        after = self.engine_stats()
        demand = sum(job.metrics.prompt_tokens + output for job in outcome.jobs) if outcome else demand
        result = {
            "requests": n,
            "kv_capacity_tokens": capacity,
            "kv_demand_tokens": demand,
            "demand_over_capacity": round(demand / capacity, 2),
            "failed": failures,
            "preemptions": int(after["preemptions"]) - int(before["preemptions"]),
            "kv_usage_max": round(max(usage, default=0.0), 3),
            "elapsed_s": round(outcome.finished - outcome.started, 1) if outcome else None,
            "ttft_p95_ms": _round(percentile([j.metrics.ttft_ms for j in outcome.jobs], 95)) if outcome else None,
        }
        self.progress(
            f"peak [{mode}]: {result['failed']} failed, {result['preemptions']} preemptions, KV usage max {result['kv_usage_max']}"
        )
        return result

    def prefix_reuse(self) -> dict:
        from inference import services

        self.progress("prefix reuse: a summary, then a clause extraction on the same document")
        self._workers("split")
        self._set_mode("appliance")
        document = self._document(self._tokens(self.options["prefix_tokens"]))
        output = self._tokens(self.options["document_output"])
        first = self._submit_schedule("appliance", self._document_schedule([document], output=output)).jobs[0]
        clauses = (0.0, lambda: services.job_create_clauses(owner=self.owner, document=document, taxonomy="office"))
        second = self._submit_schedule("appliance", [clauses]).jobs[0]
        result = {
            "prompt_tokens": first.metrics.prompt_tokens,
            "first_prefill_ms": _round(first.metrics.prefill_ms),
            "second_prefill_ms": _round(second.metrics.prefill_ms),
            "second_cached_prompt_tokens": second.metrics.cached_prompt_tokens,
            "ratio": _ratio(second.metrics.prefill_ms, first.metrics.prefill_ms),
            "second_job": "clause extraction (office categories)",
        }
        self.progress(
            f"prefix reuse: {result['second_prefill_ms']} ms vs {result['first_prefill_ms']} ms = x{result['ratio']}"
        )
        return result


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _summarise(results: dict) -> None:
    interference = results.get("interference", {})
    fifo = interference.get("fifo")
    for _mode, figures in interference.items():
        figures["throughput_vs_fifo"] = (
            _ratio(figures["documents_per_minute"], fifo["documents_per_minute"]) if fifo else None
        )
    verdict = {}
    appliance = interference.get("appliance")
    if appliance:
        verdict["ttft_ratio"] = _meets(appliance["ttft_p95_ratio"], TARGETS["ttft_ratio"], below=True)
        verdict["itl_ratio"] = _meets(appliance["itl_p95_ratio"], TARGETS["itl_ratio"], below=True)
        if appliance.get("throughput_vs_fifo") is not None:
            verdict["throughput_vs_fifo"] = _meets(
                appliance["throughput_vs_fifo"], TARGETS["throughput_vs_fifo"], below=False
            )
    if "overhead" in results:
        verdict["overhead"] = _meets(results["overhead"]["ratio"], TARGETS["overhead"], below=False)
    if "peak" in results and "appliance" in results["peak"]:
        peak = results["peak"]["appliance"]
        verdict["peak"] = "met" if peak["failed"] == 0 and peak["preemptions"] == 0 else "missed"
    if "prefix" in results:
        verdict["prefix"] = _meets(results["prefix"]["ratio"], TARGETS["prefix"], below=True)
    results["targets"] = TARGETS
    results["verdict"] = verdict


def _meets(value: float | None, target: float, *, below: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if (value <= target if below else value >= target) else "missed"


def _table(results: dict) -> list[str]:
    lines = [f"Scheduling benchmark on {results['engine'].get('device_name')} ({results['engine'].get('model')}, "
             f"context {results['engine'].get('max_model_len')}, KV {results['engine'].get('kv_capacity_tokens')} tokens)"]  # fmt: skip
    interference = results.get("interference", {})
    if interference:
        lines += [
            "",
            "Interference: drafting beside a document backlog, each ratio against drafting alone",
            f"{'policy':<10} {'TTFT p95 ms':>16} {'ratio':>7} {'ITL p95 ms':>14} {'ratio':>7} {'docs/min':>9} {'vs fifo':>8} {'preempt':>8}",
        ]
        for mode, f in interference.items():
            alone, busy = f["drafting_alone"], f["drafting_with_backlog"]
            lines.append(
                f"{mode:<10} {alone['ttft_p95_ms']:>7} -> {busy['ttft_p95_ms']:>6} {f['ttft_p95_ratio']:>7} "
                f"{alone['itl_p95_ms']:>5} -> {busy['itl_p95_ms']:>5} {f['itl_p95_ratio']:>7} "
                f"{f['documents_per_minute']:>9} {f.get('throughput_vs_fifo') or '':>8} "
                f"{busy['preemptions'] + f['document_preemptions']:>8}"
            )
        lines.append(
            f"targets for appliance: TTFT ratio <= {TARGETS['ttft_ratio']}, ITL ratio <= {TARGETS['itl_ratio']}, docs/min vs fifo >= {TARGETS['throughput_vs_fifo']}"
        )
    if "overhead" in results:
        o = results["overhead"]
        lines += [
            "",
            f"Overhead: {o['appliance_tokens_per_s']} tokens/s through the appliance vs {o['direct_tokens_per_s']} straight on AsyncLLM = {o['ratio']} (target >= {TARGETS['overhead']})",
        ]
    for mode, p in results.get("peak", {}).items():
        lines += [
            "",
            f"Peak [{mode}]: {p['requests']} requests, KV demand {p['demand_over_capacity']}x capacity: "
            f"{p['failed']} failed, {p['preemptions']} preemptions, KV usage max {p['kv_usage_max']}, done in {p['elapsed_s']} s",
        ]
    if "prefix" in results:
        p = results["prefix"]
        lines += [
            "",
            f"Prefix reuse: second job's prefill {p['second_prefill_ms']} ms vs first {p['first_prefill_ms']} ms = {p['ratio']} (target <= {TARGETS['prefix']}); {p['second_cached_prompt_tokens']} of {p['prompt_tokens']} prompt tokens cached",
        ]
    lines += ["", "Verdict: " + ", ".join(f"{k} {v}" for k, v in results.get("verdict", {}).items())]
    return lines
