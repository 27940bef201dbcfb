"""The engine host: one long-lived process per device that embeds vLLM's ``AsyncLLM``.

It owns the device, loads the model once, and serves the thin Celery workers over a Unix socket
(see ``protocol.py``): ``generate`` streams token deltas, ``abort`` stops a request, ``stats``
reports the engine, ``count_tokens`` measures a prompt. Requests pass KV admission before they
reach the engine. This module and its siblings are the only code that imports vLLM, and only
inside functions: vLLM starts its engine core with ``spawn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engine.admission import AdmissionRefused, KvAdmission
from inference.engine.protocol import MAX_LINE_BYTES, GenerateRequest, Priority, ProtocolError, decode, encode
from inference.engine.scheduling import PrefillLane, Scheduling, round_to_block

logger = logging.getLogger(__name__)

WAITING_REPORT_INTERVAL_S = 1.0


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    socket_path: Path
    licence: str
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int = 8192
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_gib: int = 2
    kv_block_size: int | None = None  # None: vLLM's default for the device
    kv_capacity_tokens: int | None = None  # None: all the KV cache vLLM finds room for
    kv_safety_factor: float = 0.9
    kv_decode_reserve_fraction: float = 0.1
    scheduling: Scheduling = Scheduling.APPLIANCE
    prefill_slice_tokens: int | None = None  # None: 128 on a CPU, 512 on a GPU
    prefill_max_pause_s: float = 5.0

    @classmethod
    def from_settings(cls) -> EngineConfig:
        from django.conf import settings

        return cls(
            model=Path(settings.APPLIANCE_MODEL),
            socket_path=Path(settings.APPLIANCE_ENGINE_SOCKET),
            licence=settings.APPLIANCE_MODEL_LICENCE,
            dtype=settings.APPLIANCE_DTYPE,
            kv_cache_dtype=settings.APPLIANCE_KV_CACHE_DTYPE,
            max_model_len=settings.APPLIANCE_MAX_MODEL_LEN,
            max_num_seqs=settings.APPLIANCE_MAX_NUM_SEQS,
            max_num_batched_tokens=settings.APPLIANCE_MAX_NUM_BATCHED_TOKENS,
            long_prefill_token_threshold=settings.APPLIANCE_LONG_PREFILL_TOKEN_THRESHOLD,
            gpu_memory_utilization=settings.APPLIANCE_GPU_MEMORY_UTILIZATION,
            cpu_kv_cache_gib=settings.APPLIANCE_CPU_KV_CACHE_GIB,
            kv_block_size=settings.APPLIANCE_KV_BLOCK_SIZE,
            kv_capacity_tokens=settings.APPLIANCE_KV_CAPACITY_TOKENS,
            kv_safety_factor=settings.APPLIANCE_KV_SAFETY_FACTOR,
            kv_decode_reserve_fraction=settings.APPLIANCE_KV_DECODE_RESERVE,
            scheduling=Scheduling(settings.APPLIANCE_SCHEDULING),
            prefill_slice_tokens=settings.APPLIANCE_PREFILL_SLICE_TOKENS,
            prefill_max_pause_s=settings.APPLIANCE_PREFILL_MAX_PAUSE_S,
        )


@dataclass
class _Run:
    """One generate request in the host, from arrival to its last token."""

    request: GenerateRequest
    prompt_ids: list[int]
    scheduling: Scheduling
    submitted_at: float = field(default_factory=time.time)
    admitted_at: float | None = None
    first_token_at: float | None = None
    waiting_for: str | None = None  # "kv_budget" or "prefill_lane" while it waits
    engine_request_id: str = ""
    sliced_tokens: int = 0  # prompt tokens already in the prefix cache by this request's slices
    slices: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache, computed before this request


class _EngineStats:
    """The latest scheduler figures vLLM reports, kept by a stat logger it calls each step."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.preemptions = 0
        self.updated_at = 0.0


def _stat_logger_factory(stats: _EngineStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class ApplianceStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:  # noqa: ARG002
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:  # noqa: ARG002
            if scheduler_stats is not None:
                stats.running = scheduler_stats.num_running_reqs
                stats.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                stats.kv_usage = float(scheduler_stats.kv_cache_usage)
                stats.prefix_cache_queries += scheduler_stats.prefix_cache_stats.queries
                stats.prefix_cache_hits += scheduler_stats.prefix_cache_stats.hits
                stats.updated_at = time.time()
            if iteration_stats is not None:
                stats.preemptions += iteration_stats.num_preempted_reqs

        def log_engine_initialized(self) -> None:
            pass

    return ApplianceStatLogger


def _device_description() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {
            "device": "cuda",
            "device_name": props.name,
            "device_count": torch.cuda.device_count(),
            "device_memory_bytes": int(props.total_memory),
            "driver": torch.version.cuda,
        }
    return {
        "device": "cpu",
        "device_name": platform.processor() or platform.machine(),
        "device_count": 1,
        "cpu_count": os.cpu_count(),
        "driver": None,
    }


class EngineHost:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine = None
        self.tokenizer = None
        self.admission: KvAdmission | None = None
        self.scheduling = config.scheduling
        self.lane = PrefillLane(max_pause_s=config.prefill_max_pause_s)
        self.slice_tokens = 0
        self.stats = _EngineStats()
        self.info: dict[str, Any] = {}
        self.started_at = time.time()
        self.requests_served = 0

    # --- start-up ------------------------------------------------------------------------

    def start_engine(self) -> None:
        import torch
        import vllm
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config
        cache_args: dict[str, int] = {}
        if cfg.kv_block_size:
            cache_args["block_size"] = cfg.kv_block_size
        if cfg.kv_capacity_tokens:
            # vLLM counts in blocks: fix the block size so that the count means what it says.
            block = cfg.kv_block_size or (16 if torch.cuda.is_available() else 128)
            cache_args["block_size"] = block
            cache_args["num_gpu_blocks_override"] = max(1, cfg.kv_capacity_tokens // block)
        args = AsyncEngineArgs(
            model=str(cfg.model),
            tokenizer=str(cfg.model),
            dtype=cfg.dtype,
            kv_cache_dtype=cfg.kv_cache_dtype,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            scheduling_policy="priority",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            disable_log_stats=False,
            **cache_args,
            # Compact JSON: a model may not spend its token budget on whitespace between fields.
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self.stats)])
        self.tokenizer = self.engine.get_tokenizer()
        vcfg = self.engine.vllm_config
        cache = vcfg.cache_config
        capacity = int((cache.num_gpu_blocks or 0) * cache.block_size)
        self.admission = KvAdmission(
            capacity,
            safety_factor=cfg.kv_safety_factor,
            decode_reserve_fraction=cfg.kv_decode_reserve_fraction,
        )
        device = _device_description()
        default_slice = 128 if device["device"] == "cpu" else 512
        self.slice_tokens = round_to_block(cfg.prefill_slice_tokens or default_slice, int(cache.block_size))
        self.info = {
            "model": cfg.model.name,
            "model_path": str(cfg.model),
            "licence": cfg.licence,
            "dtype": str(vcfg.model_config.dtype).removeprefix("torch."),
            # "auto" means the KV cache is stored in the model's own dtype: say which.
            "kv_cache_dtype": str(vcfg.model_config.dtype).removeprefix("torch.")
            if str(cache.cache_dtype) == "auto"
            else str(cache.cache_dtype),
            "max_model_len": int(vcfg.model_config.max_model_len),
            "kv_capacity_tokens": capacity,
            "kv_block_size": int(cache.block_size),
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
            "prefix_caching": True,
            "vllm_scheduling_policy": "priority",
            "prefill_slice_tokens": self.slice_tokens,
            "prefill_max_pause_s": cfg.prefill_max_pause_s,
            "kv_safety_factor": cfg.kv_safety_factor,
            "kv_decode_reserve_fraction": cfg.kv_decode_reserve_fraction,
            "pid": os.getpid(),
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            **device,
        }
        logger.info("engine ready: %s", self.info)

    # --- requests --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        assert self.admission is not None
        queries = self.stats.prefix_cache_queries
        return {
            **self.info,
            "running": self.stats.running,
            "waiting": self.stats.waiting,
            "kv_usage": round(self.stats.kv_usage, 4),
            "prefix_cache_hit_rate": round(self.stats.prefix_cache_hits / queries, 4) if queries else 0.0,
            "preemptions": self.stats.preemptions,
            "requests_served": self.requests_served,
            "uptime_s": round(time.time() - self.started_at, 1),
            "scheduling": str(self.scheduling),
            **self.admission.snapshot(),
            **self.lane.snapshot(),
        }

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if not line:
                return
            message = decode(line)
            op = message.get("op")
            if op == "stats":
                writer.write(encode({"type": "stats", **self.snapshot()}))
            elif op == "count_tokens":
                prompts = message.get("prompts", [])
                counts = await asyncio.to_thread(lambda: [len(self.prompt_token_ids(m)) for m in prompts])
                writer.write(encode({"type": "counts", "counts": counts}))
            elif op == "abort":
                await self.engine.abort(str(message.get("request_id")))
                writer.write(encode({"type": "aborted"}))
            elif op == "set_scheduling":
                try:
                    self.scheduling = Scheduling(str(message.get("scheduling")))
                except ValueError:
                    raise ProtocolError(f"unknown scheduling {message.get('scheduling')!r}") from None
                logger.info("scheduling is now %s", self.scheduling)
                writer.write(encode({"type": "scheduling", "scheduling": str(self.scheduling)}))
            elif op == "reset_prefix_cache":
                await self.engine.reset_prefix_cache()
                writer.write(encode({"type": "reset"}))
            elif op == "run_direct":
                writer.write(encode({"type": "direct", **await self._run_direct(message)}))
            elif op == "generate":
                await self._generate(GenerateRequest.from_message(message), reader, writer)
            else:
                raise ProtocolError(f"unknown op {op!r}")
        except ProtocolError as exc:
            writer.write(encode({"type": "error", "code": "protocol", "detail": str(exc)}))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # the host keeps serving whatever one request does
            logger.exception("request failed")
            with contextlib.suppress(Exception):
                writer.write(encode({"type": "error", "code": "engine", "detail": f"{type(exc).__name__}: {exc}"}))
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
                writer.close()

    async def _generate(
        self, request: GenerateRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        scheduling = self.scheduling
        # A drafter counts from the moment it arrives: documents hold their prefill from now on.
        drafting = scheduling.prefill_lane and request.priority <= Priority.DECODE
        if drafting:
            self.lane.drafting_started()
        try:
            # Tokenising a long document takes a while: off the loop, so that streams keep flowing.
            prompt_ids = await asyncio.to_thread(self.prompt_token_ids, request.messages)
            max_len = self.info["max_model_len"]
            if len(prompt_ids) + request.max_tokens > max_len:
                detail = (
                    f"the prompt has {len(prompt_ids)} tokens and asks for {request.max_tokens} more; "
                    f"the model's context holds {max_len}"
                )
                writer.write(encode({"type": "error", "code": "too_long", "detail": detail}))
                return
            # The connection is the request: when the client goes away, give everything back.
            gone = asyncio.create_task(reader.read(1))
            run = _Run(request=request, prompt_ids=prompt_ids, scheduling=scheduling)
            work = asyncio.create_task(self._run(run, writer))
            ticker = asyncio.create_task(self._report_waiting(run, writer))
            try:
                done, _ = await asyncio.wait({gone, work}, return_when=asyncio.FIRST_COMPLETED)
                if work not in done:  # client gone
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await work
                    if run.engine_request_id:
                        await self.engine.abort(run.engine_request_id)
                else:
                    work.result()
            finally:
                gone.cancel()
                ticker.cancel()
        finally:
            if drafting:
                self.lane.drafting_finished()

    async def _run(self, run: _Run, writer: asyncio.StreamWriter) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        assert self.admission is not None
        request, prompt_ids = run.request, run.prompt_ids
        kv_tokens = len(prompt_ids) + request.max_tokens
        reservation = None
        lane_held = False
        try:
            if run.scheduling.admission_control:
                run.waiting_for = "kv_budget"
                try:
                    reservation = await self.admission.acquire(request.request_id, kv_tokens, request.priority)
                except AdmissionRefused as exc:
                    writer.write(encode({"type": "error", "code": "kv_budget", "detail": str(exc)}))
                    return
                finally:
                    run.waiting_for = None
            run.admitted_at = time.time()
            writer.write(
                encode(
                    {
                        "type": "admitted",
                        "prompt_tokens": len(prompt_ids),
                        "kv_reservation_tokens": kv_tokens if reservation else 0,
                        "admission_wait_ms": round((run.admitted_at - run.submitted_at) * 1000, 3),
                        "engine": platform.node(),
                        "model": self.info["model"],
                        "scheduling": str(run.scheduling),
                    }
                )
            )
            await writer.drain()
            priority = request.priority if run.scheduling.priorities else Priority.DECODE
            if run.scheduling.prefill_lane and request.priority > Priority.DECODE:
                await self._prefill_in_slices(run, priority)
                run.waiting_for = "prefill_lane"
                await self.lane.acquire(len(prompt_ids) - run.sliced_tokens)
                run.waiting_for = None
                lane_held = True
            params = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                frequency_penalty=request.frequency_penalty,
                seed=request.seed,
                stop=request.stop or None,
                ignore_eos=request.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
                structured_outputs=StructuredOutputsParams(json=request.json_schema) if request.json_schema else None,
            )
            run.engine_request_id = request.request_id
            outputs = self.engine.generate(
                {"prompt_token_ids": prompt_ids}, params, request.request_id, priority=priority
            )
            output_tokens = 0
            # aclosing: if the client leaves mid-stream, vLLM's generator is closed (and the
            # request aborted) now, not whenever it is garbage-collected.
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if lane_held:  # the prompt is in: the next document may prefill
                        self.lane.release()
                        lane_held = False
                    if run.first_token_at is None:
                        run.first_token_at = time.time()
                        run.cached_tokens += max(0, int(output.num_cached_tokens or 0) - run.sliced_tokens)
                    completion = output.outputs[0]
                    output_tokens += len(completion.token_ids)
                    if completion.text or completion.token_ids:
                        writer.write(
                            encode({"type": "delta", "text": completion.text, "tokens": len(completion.token_ids)})
                        )
                        await writer.drain()
                    if output.finished:
                        self.requests_served += 1
                        writer.write(encode(self._done_message(run, output, completion, output_tokens)))
        finally:
            if lane_held:
                self.lane.release()
            if reservation is not None:
                self.admission.release(reservation)

    async def _prefill_in_slices(self, run: _Run, priority: int) -> None:
        """Prefill all of a document's prompt but its last slice, one lane turn per slice.

        Each slice is a request for the next block-aligned prefix with one output token; the
        prefix cache keeps it for the next slice and the final request. A slice that was already
        cached (the same document read by an earlier job) costs nothing, so the next one is
        twice as long."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0)
        size = self.slice_tokens
        total = len(run.prompt_ids)
        while run.sliced_tokens + size + 1 < total:
            end = run.sliced_tokens + size
            run.waiting_for = "prefill_lane"
            await self.lane.acquire(total - run.sliced_tokens)
            run.waiting_for = None
            try:
                run.engine_request_id = f"{run.request.request_id}-slice{run.slices}"
                found = 0
                # One token past the block boundary: vLLM always computes a prompt's last token,
                # so only then does a fully cached slice show as cached up to ``end``.
                outputs = self.engine.generate(
                    {"prompt_token_ids": run.prompt_ids[: end + 1]}, params, run.engine_request_id, priority=priority
                )
                async with contextlib.aclosing(outputs):
                    async for output in outputs:
                        found = int(output.num_cached_tokens or 0)
            finally:
                self.lane.release()
            run.cached_tokens += max(0, found - run.sliced_tokens)
            size = size * 2 if found >= end else self.slice_tokens
            run.sliced_tokens = end
            run.slices += 1

    async def _report_waiting(self, run: _Run, writer: asyncio.StreamWriter) -> None:
        """Until the first token, say once a second what the request is doing (waiting for KV
        budget or its prefill turn, or reading its prompt): the worker shows it to the user and
        uses it to notice a cancel."""
        assert self.admission is not None
        while run.first_token_at is None:
            await asyncio.sleep(WAITING_REPORT_INTERVAL_S)
            reason = run.waiting_for
            if reason == "kv_budget":
                message = {
                    "type": "waiting",
                    "reason": reason,
                    "position": self.admission.position(run.request.request_id),
                }
            elif reason is not None:
                message = {"type": "waiting", "reason": reason, "position": self.lane.waiting}
            elif run.admitted_at is not None and run.first_token_at is None:
                message = {"type": "prefill", "tokens_done": run.sliced_tokens, "prompt_tokens": len(run.prompt_ids)}
            else:
                continue
            writer.write(encode(message))
            await writer.drain()

    @staticmethod
    def _done_message(run: _Run, output, completion, output_tokens: int) -> dict[str, Any]:
        metrics = getattr(output, "metrics", None)
        prefill_ms = (run.first_token_at - run.admitted_at) * 1000 if run.first_token_at and run.admitted_at else None
        return {
            "type": "done",
            "finish_reason": completion.finish_reason,
            "prompt_tokens": len(run.prompt_ids),
            "output_tokens": output_tokens,
            "cached_prompt_tokens": run.cached_tokens,
            "prefill_ms": round(prefill_ms, 3) if prefill_ms is not None else None,
            "prefill_slices": run.slices,
            "preemptions": int(getattr(metrics, "num_preemptions", 0) or 0),
        }

    async def _run_direct(self, message: dict[str, Any]) -> dict[str, Any]:
        """Benchmarks: run requests straight on ``AsyncLLM``, all at once, with no admission, lane,
        socket streaming or worker in between: the baseline the appliance's path is compared to."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        requests = [GenerateRequest.from_message({"op": "generate", **m}) for m in message.get("requests", [])]
        prompts = await asyncio.to_thread(lambda: [self.prompt_token_ids(r.messages) for r in requests])

        async def one(request: GenerateRequest, prompt_ids: list[int]) -> tuple[int, float, float]:
            params = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                ignore_eos=request.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
            )
            start, first, tokens = time.perf_counter(), None, 0
            async for output in self.engine.generate({"prompt_token_ids": prompt_ids}, params, request.request_id):
                tokens += len(output.outputs[0].token_ids)
                first = first or time.perf_counter()
            return tokens, (first or start) - start, time.perf_counter() - start

        started = time.perf_counter()
        results = await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts, strict=True)))
        return {
            "output_tokens": sum(r[0] for r in results),
            "ttft_s": [round(r[1], 4) for r in results],
            "elapsed_s": round(time.perf_counter() - started, 4),
        }

    # --- serving -----------------------------------------------------------------------------

    async def serve(self) -> None:
        path = self.config.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by a host that died
        server = await asyncio.start_unix_server(self.handle, path=str(path), limit=MAX_LINE_BYTES)
        os.chmod(path, 0o660)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        logger.info("engine host listening on %s", path)
        async with server:
            await stop.wait()
        logger.info("engine host stopping")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        engine, self.engine = self.engine, None
        engine.shutdown()


def run(config: EngineConfig) -> None:
    """Entry point (``manage.py engine_host``): start vLLM, then serve until SIGINT/SIGTERM."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kv_cache_gib))
    host = EngineHost(config)

    async def main() -> None:
        host.start_engine()  # blocks until the model is loaded; the socket appears only then
        await host.serve()

    asyncio.run(main())
