"""The engine host: one long-lived process per device that embeds vLLM's ``AsyncLLM``.

It owns the device, loads the model once, and serves the thin Celery workers over a Unix socket,
and, with ``APPLIANCE_ENGINE_LISTEN``, over TCP with TLS to other nodes' workers (see ``address.py``,
``protocol.py``): ``generate`` streams token deltas, ``abort`` stops a request, ``stats``
reports the engine, ``activity`` its drafting (cheaply, for the ingest's embedder beside it),
``count_tokens`` measures a prompt. Scheduling happens inside vLLM's engine
core, at every step, in the appliance's scheduler class (``vllm_scheduler.py``, the policy in
``step_policy.py``): drafting first, documents in what is left of each step, KV admission by
blocks. The host hands each request to vLLM at once, tagged with its user, and reads the
scheduler's state once a second (queue positions, prefill progress, reservations).

When vLLM's engine core process dies while the host lives, the host notices within a second,
answers every request that was in the engine with ``engine_restarting`` (``in_flight``: the
worker retries it, and counts it against the job in case the job is the cause), answers
``stats`` with ``state: restarting`` (``/healthz`` goes red), starts a new engine core, and
goes back to ``ready``. Requests marked ``suspect`` (their job was in the engine when it died)
run one at a time, so that a request that kills the engine takes no other suspect with it.

This module and its siblings are the only code that imports vLLM, and only inside functions:
vLLM starts its engine core with ``spawn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import platform
import signal
import ssl
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from appliance import cpus
from inference.engine.address import check_listen, parse_host_port
from inference.engine.chat_tokens import prompt_token_ids, raw_prompt_token_ids
from inference.engine.protocol import (
    BENCHMARK_OPS,
    MAX_LINE_BYTES,
    EngineState,
    ErrorCode,
    GenerateRequest,
    Priority,
    ProtocolError,
    decode,
    encode,
)
from inference.engine.step_policy import Mode, PolicyConfig, Reservation, refusal

logger = logging.getLogger(__name__)

WAITING_REPORT_INTERVAL_S = 1.0
SCHEDULER_POLL_INTERVAL_S = 1.0
ENGINE_WATCH_INTERVAL_S = 0.5
MAX_START_FAILURES = 5  # engine cores that fail to start in a row before the host gives up


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    socket_path: Path
    licence: str
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int = 8192
    max_num_seqs: int | None = None  # None: 32 on a CPU, the capacity planner's on a GPU
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    gpu_memory_utilization: float | None = None  # None: the capacity planner's
    embedding_gpu_bytes: int = 0  # what the ingest's embedder takes of the GPU beside vLLM
    cpu_kv_cache_gib: int = 2
    kv_block_size: int | None = None  # None: vLLM's default for the device
    kv_capacity_tokens: int | None = None  # None: all the KV cache vLLM finds room for
    scheduling: Mode = Mode.APPLIANCE
    kv_reservation: Reservation = Reservation.MAX
    kv_safety_factor: float = 0.95
    kv_decode_reserve_fraction: float = 0.1
    itl_slowdown: float = 1.4
    itl_target_ms: float = 0.0
    idle_throughput_loss: float = 0.02
    drafting_recent_s: float = 30.0
    gap_step_ms: float = 0.0
    ttft_slowdown: float = 2.0
    idle_ramp_factor: float = 2.0
    chunk_fixed_cost_share: float = 0.5
    document_min_share: float = 0.2
    enforce_eager: bool = False
    token: str = ""  # every request must carry it ("": none asked, for hosts made by unit tests)
    tensor_parallel_size: int = 1  # GPUs this engine spreads the model over (vLLM's tensor parallelism)
    listen: str = ""  # host:port: TCP as well as the Unix socket ("": the socket only)
    tls_cert: str = ""  # PEM files: TLS on that TCP listener
    tls_key: str = ""
    benchmark_ops: bool = False  # serve BENCHMARK_OPS (a host a benchmark started)
    service_cpus: frozenset[int] | None = None  # where it keeps itself once ready (appliance.cpus)

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
            embedding_gpu_bytes=(
                settings.APPLIANCE_EMBEDDING_GPU_MEMORY_MB * 1024 * 1024
                if settings.APPLIANCE_EMBEDDING_DEVICE == "cuda"
                else 0
            ),
            cpu_kv_cache_gib=settings.APPLIANCE_CPU_KV_CACHE_GIB,
            kv_block_size=settings.APPLIANCE_KV_BLOCK_SIZE,
            kv_capacity_tokens=settings.APPLIANCE_KV_CAPACITY_TOKENS,
            scheduling=Mode(settings.APPLIANCE_SCHEDULING),
            kv_reservation=Reservation(settings.APPLIANCE_KV_RESERVATION),
            kv_safety_factor=settings.APPLIANCE_KV_SAFETY_FACTOR,
            kv_decode_reserve_fraction=settings.APPLIANCE_KV_DECODE_RESERVE,
            itl_slowdown=settings.APPLIANCE_DRAFTING_ITL_SLOWDOWN,
            itl_target_ms=settings.APPLIANCE_DRAFTING_ITL_TARGET_MS,
            idle_throughput_loss=settings.APPLIANCE_IDLE_THROUGHPUT_LOSS,
            drafting_recent_s=settings.APPLIANCE_DRAFTING_RECENT_S,
            gap_step_ms=settings.APPLIANCE_DRAFTING_GAP_STEP_MS,
            ttft_slowdown=settings.APPLIANCE_DRAFTING_TTFT_SLOWDOWN,
            idle_ramp_factor=settings.APPLIANCE_IDLE_RAMP_FACTOR,
            chunk_fixed_cost_share=settings.APPLIANCE_CHUNK_FIXED_COST_SHARE,
            document_min_share=settings.APPLIANCE_DOCUMENT_MIN_SHARE,
            enforce_eager=settings.APPLIANCE_ENFORCE_EAGER,
            service_cpus=cpus.service_cpus(settings),
            token=settings.APPLIANCE_ENGINE_TOKEN,
            tensor_parallel_size=settings.APPLIANCE_TENSOR_PARALLEL_SIZE,
            listen=settings.APPLIANCE_ENGINE_LISTEN,
            tls_cert=settings.APPLIANCE_ENGINE_TLS_CERT,
            tls_key=settings.APPLIANCE_ENGINE_TLS_KEY,
            benchmark_ops=settings.APPLIANCE_ENGINE_BENCHMARK_OPS,
        )

    def policy(self) -> PolicyConfig:
        return PolicyConfig(
            mode=self.scheduling,
            reservation=self.kv_reservation,
            itl_slowdown=self.itl_slowdown,
            itl_target_ms=self.itl_target_ms,
            idle_throughput_loss=self.idle_throughput_loss,
            drafting_recent_s=self.drafting_recent_s,
            gap_step_ms=self.gap_step_ms,
            ttft_slowdown=self.ttft_slowdown,
            idle_ramp_factor=self.idle_ramp_factor,
            chunk_fixed_cost_share=self.chunk_fixed_cost_share,
            document_min_share=self.document_min_share,
            kv_safety_factor=self.kv_safety_factor,
            kv_decode_reserve_fraction=self.kv_decode_reserve_fraction,
            drafting_priority=Priority.DECODE,
        )


@dataclass
class _Run:
    """One generate request in the host, from arrival to its last token."""

    request: GenerateRequest
    prompt_ids: list[int]
    mode: Mode
    submitted_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    in_engine: bool = False  # handed to vLLM (and not finished): an engine death concerns it
    isolated_wait: bool = False  # a suspect waiting for the one-suspect-at-a-time turn


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
        # vLLM's own timing of requests, summed as its Prometheus histograms sum them (``vllm
        # serve``'s /metrics): a benchmark compares the two servers' engines with vLLM's clocks.
        self.requests_finished = 0
        self.queue_s = 0.0  # queued in the engine core -> first scheduled
        self.prefill_s = 0.0  # first scheduled -> first token, in the engine core
        self.first_tokens = 0
        self.ttft_s = 0.0  # the frontend's arrival -> its first token

    def request_timing(self) -> dict[str, float | int]:
        return {
            "requests_finished": self.requests_finished,
            "queue_s": round(self.queue_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "first_tokens": self.first_tokens,
            "ttft_s": round(self.ttft_s, 6),
        }


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
                for finished in iteration_stats.finished_requests:
                    stats.requests_finished += 1
                    stats.queue_s += finished.queued_time
                    stats.prefill_s += finished.prefill_time
                stats.first_tokens += len(iteration_stats.time_to_first_tokens_iter)
                stats.ttft_s += sum(iteration_stats.time_to_first_tokens_iter)

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


# CPU features that give bfloat16 arithmetic in hardware (x86: AVX-512 BF16, AMX; Arm: BF16).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def check_kv_capacity(tokens: int, *, max_model_len: int, block: int) -> None:
    """A KV capacity given in tokens must hold one request of the whole context beside the
    block vLLM keeps back (its null block); otherwise the engine core refuses to start with a
    traceback. ValueError with what to give instead."""
    least = -(-max_model_len // block) * block + block
    if tokens < least:
        raise ValueError(
            f"APPLIANCE_KV_CAPACITY_TOKENS={tokens} cannot hold one request of the model's context "
            f"({max_model_len} tokens) beside the block vLLM keeps back: give at least {least}, "
            "or a smaller APPLIANCE_MAX_MODEL_LEN"
        )


def cpu_weight_dtype(requested: str, flags: set[str] | frozenset[str]) -> tuple[str, str]:
    """The weights' dtype on a CPU, and why. ``auto`` (the model's own, bfloat16 for most) is
    kept where the CPU computes in bfloat16; elsewhere every bfloat16 product is converted in
    software, and float32 reads prompts about 4x faster (measured on an AVX2 EPYC: 155 against
    37 prompt tokens/s; decoding 70 against 66 ms a token) at twice the memory, which a CPU box has."""
    if requested != "auto":
        return requested, f"{requested}, as configured"
    if flags & NATIVE_BF16_FLAGS:
        return "auto", "the model's own dtype: this CPU computes in bfloat16"
    return "float32", "this CPU has no bfloat16 arithmetic (no AVX-512 BF16 or AMX), and float32 prefills ~4x faster"


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


class EngineHost:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.policy = config.policy()
        # vLLM's AsyncLLM while one runs, None while it is (re)started. Typed Any: the host uses
        # what the pinned vLLM release has (pyproject holds it to 0.32.x), not a stable interface.
        self.engine: Any = None
        self.tokenizer = None
        self.state = EngineState.RESTARTING  # until the first engine core is ready
        self.restarts = 0
        self.last_death: dict[str, Any] | None = None
        self.stats = _EngineStats()
        self.info: dict[str, Any] = {}
        self.scheduler_state: dict[str, Any] = {}
        self.started_at = time.time()
        self.requests_served = 0
        self.runs: dict[str, _Run] = {}
        self.cores = cpus.EngineHostCores(config.service_cpus)
        self.drafting_ended_at: float | None = None  # monotonic: the last drafting request's end
        self._suspect_turn: asyncio.Lock | None = None
        self._restart_task: asyncio.Task | None = None

    # --- start-up ------------------------------------------------------------------------

    def device_defaults(self) -> EngineConfig:
        """The configuration with what the operator left unset filled in for this device: 32
        requests at once on a CPU; on a GPU, vLLM's share of memory and the batch size from the
        capacity planner (the served model's shape and the GPU's memory)."""
        import torch

        cfg = self.config
        if not torch.cuda.is_available():
            dtype, reason = cpu_weight_dtype(cfg.dtype, _cpu_flags())
            if dtype != cfg.dtype:
                logger.info("weights in %s: %s", dtype, reason)
            return replace(cfg, dtype=dtype, max_num_seqs=cfg.max_num_seqs or 32)
        if cfg.max_num_seqs is not None and cfg.gpu_memory_utilization is not None:
            return cfg
        from inference.capacity import GPU_RUNTIME_RESERVE_BYTES, gpu_engine_defaults, shape_of_model_dir

        shape = shape_of_model_dir(cfg.model, weight_dtype=cfg.dtype, kv_dtype=cfg.kv_cache_dtype)
        # Tensor parallel: the model and its KV cache are split over the group's GPUs (the
        # visible ones, CUDA_VISIBLE_DEVICES), so the planner sees their memory together.
        memory = int(torch.cuda.get_device_properties(0).total_memory) * cfg.tensor_parallel_size
        # The ingest's embedder on this GPU (APPLIANCE_EMBEDDING_DEVICE=cuda) is left its share.
        defaults = gpu_engine_defaults(
            shape, device_memory_bytes=memory, reserve_bytes=GPU_RUNTIME_RESERVE_BYTES + cfg.embedding_gpu_bytes
        )
        logger.info("GPU defaults from the capacity planner: %s", defaults.reason)
        return replace(
            cfg,
            max_num_seqs=cfg.max_num_seqs or defaults.max_num_seqs,
            gpu_memory_utilization=cfg.gpu_memory_utilization or defaults.gpu_memory_utilization,
        )

    def _build_engine(self):
        """A new ``AsyncLLM`` (blocks until its engine core has loaded the model), with the
        appliance's scheduler class: the synchronous or the asynchronous variant, as vLLM
        decided for this device."""
        self.cores.for_starting()
        import torch
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from inference.engine.vllm_scheduler import CONFIG_ENV, scheduler_class_path

        cfg = self.config = self.device_defaults()
        cache_args: dict[str, int] = {}
        if cfg.kv_block_size:
            cache_args["block_size"] = cfg.kv_block_size
        if cfg.kv_capacity_tokens:
            # vLLM counts in blocks: fix the block size so that the count means what it says.
            block = cfg.kv_block_size or (16 if torch.cuda.is_available() else 128)
            check_kv_capacity(cfg.kv_capacity_tokens, max_model_len=cfg.max_model_len, block=block)
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
            gpu_memory_utilization=cfg.gpu_memory_utilization or 0.9,
            disable_log_stats=False,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=cfg.tensor_parallel_size,
            **cache_args,
            # Compact JSON: a model may not spend its token budget on whitespace between fields.
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        )
        vllm_config = args.create_engine_config()
        scheduler = vllm_config.scheduler_config
        scheduler.scheduler_cls = scheduler_class_path(async_scheduling=bool(scheduler.async_scheduling))
        os.environ[CONFIG_ENV] = json.dumps(self.policy.to_dict())  # the spawned engine core reads it
        return AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[_stat_logger_factory(self.stats)])

    def start_engine(self) -> None:
        self._engine_ready(self._build_engine())

    def _engine_ready(self, engine) -> None:
        import torch
        import vllm

        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        vcfg = engine.vllm_config
        cache = vcfg.cache_config
        capacity = int((cache.num_gpu_blocks or 0) * cache.block_size)
        device = _device_description()
        self.info = {
            "model": self.config.model.name,
            "model_path": str(self.config.model),
            "licence": self.config.licence,
            "dtype": str(vcfg.model_config.dtype).removeprefix("torch."),
            # "auto" means the KV cache is stored in the model's own dtype: say which.
            "kv_cache_dtype": str(vcfg.model_config.dtype).removeprefix("torch.")
            if str(cache.cache_dtype) == "auto"
            else str(cache.cache_dtype),
            "max_model_len": int(vcfg.model_config.max_model_len),
            "kv_capacity_tokens": capacity,
            "kv_block_size": int(cache.block_size),
            "kv_blocks": int(cache.num_gpu_blocks or 0),
            "max_num_seqs": self.config.max_num_seqs,
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "gpu_memory_utilization": self.config.gpu_memory_utilization if device["device"] == "cuda" else None,
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "prefix_caching": True,
            "enforce_eager": bool(vcfg.model_config.enforce_eager),
            "vllm_scheduling_policy": "priority",
            "scheduler_class": str(vcfg.scheduler_config.scheduler_cls),
            "async_scheduling": bool(vcfg.scheduler_config.async_scheduling),
            "pid": os.getpid(),
            **self.cores.engine_ready(),  # the model's cores and the services' (appliance.cpus)
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            **device,
        }
        self.state = EngineState.READY
        logger.info("engine ready: %s", self.info)

    # --- the scheduler inside the engine core ------------------------------------------------

    async def _scheduler_call(self, command: str, payload: dict | None = None) -> dict[str, Any]:
        from inference.engine.vllm_scheduler import UTILITY_METHOD

        answer = await self.engine.engine_core.call_utility_async(UTILITY_METHOD, command, json.dumps(payload or {}))
        return json.loads(answer)

    async def _poll_scheduler(self) -> None:
        """Once a second: the scheduler's state (queue positions, prefill progress, ...)."""
        while True:
            if self.state == EngineState.READY and self.engine is not None and not self.engine.errored:
                try:
                    self.scheduler_state = await asyncio.wait_for(self._scheduler_call("snapshot"), timeout=10)
                except Exception:  # noqa: BLE001 - an engine that died is the watcher's business
                    logger.debug("scheduler snapshot failed", exc_info=True)
            await asyncio.sleep(SCHEDULER_POLL_INTERVAL_S)

    def kv_budget_tokens(self) -> int:
        blocks = int(self.info.get("kv_blocks", 0)) - 1
        return int(blocks * self.policy.kv_safety_factor) * int(self.info.get("kv_block_size", 1))

    # --- engine death ------------------------------------------------------------------------

    async def _watch_engine(self) -> None:
        while True:
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
            engine = self.engine
            if engine is not None and engine.errored:
                self._engine_died(engine)

    def _engine_died(self, engine) -> None:
        """The engine core of ``engine`` is gone (seen by the watcher, or by a request that was
        in it, whichever is first): from now on new requests are answered ``restarting``, and a
        new engine core is started. Idempotent per engine."""
        if engine is not self.engine or self.state != EngineState.READY:
            return
        in_flight = sorted(rid for rid, run in self.runs.items() if run.in_engine)
        self.state = EngineState.RESTARTING
        self.restarts += 1
        self.last_death = {"at": time.time(), "in_flight": in_flight}
        logger.error(
            "the engine core died (restart %d); %d request(s) were in it: %s", self.restarts, len(in_flight), in_flight
        )
        self._restart_task = asyncio.get_running_loop().create_task(self._restart_engine())

    async def _restart_engine(self) -> None:
        engine, self.engine = self.engine, None
        with contextlib.suppress(Exception):
            engine.shutdown()
        failures = 0
        started = time.monotonic()
        while True:
            try:
                new_engine = await asyncio.to_thread(self._build_engine)
                break
            except Exception:
                failures += 1
                logger.exception("the engine core did not start (%d in a row)", failures)
                if failures >= MAX_START_FAILURES:
                    # The supervisor starts the whole host again, with a growing pause.
                    logger.critical("giving up: the engine host exits")
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                await asyncio.sleep(min(30.0, 2.0**failures))
        self.scheduler_state = {}
        self._engine_ready(new_engine)
        logger.warning("the engine core is ready again after %.0f s", time.monotonic() - started)

    def _restarting_error(self, *, in_flight: bool) -> dict[str, Any]:
        detail = (
            "The engine stopped while this request was in it; it is being started again."
            if in_flight
            else "The engine is being started again; try again in a few seconds."
        )
        return {"type": "error", "code": ErrorCode.ENGINE_RESTARTING, "in_flight": in_flight, "detail": detail}

    # --- requests --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        state = self.scheduler_state
        kv = state.get("kv", {})
        block = int(kv.get("block_size", self.info.get("kv_block_size", 1)))
        waiting = state.get("waiting", [])
        queries = self.stats.prefix_cache_queries
        return {
            **self.info,
            "state": EngineState.RESTARTING if self.engine is not None and self.engine.errored else self.state,
            "restarts": self.restarts,
            "last_engine_death": self.last_death,
            "running": self.stats.running,
            "waiting": self.stats.waiting,
            "kv_usage": round(self.stats.kv_usage, 4),
            "prefix_cache_hit_rate": round(self.stats.prefix_cache_hits / queries, 4) if queries else 0.0,
            "preemptions": self.stats.preemptions,
            "request_timing": self.stats.request_timing(),
            "requests_served": self.requests_served,
            "requests_in_host": len(self.runs),
            "request_ids": sorted(self.runs),
            "uptime_s": round(time.time() - self.started_at, 1),
            "scheduling": str(self.policy.mode),
            "kv_reservation": str(self.policy.reservation),
            "kv_budget_tokens": self.kv_budget_tokens() if self.info else 0,
            "kv_reserved_tokens": int(kv.get("reserved_tokens", 0)),
            "kv_reserved_future_tokens": int(kv.get("reserved_future_blocks", 0)) * block,
            "admitted_requests": len(state.get("reservations", {})),
            "admitted_request_ids": sorted(state.get("reservations", {})),
            "waiting_for_admission": sum(1 for _, why in waiting if why == "kv_budget"),
            "drafting_requests": sum(1 for run in self.runs.values() if run.in_engine and run.request.drafting),
            "documents_held": int(state.get("plan", {}).get("held", 0)),
            "document_budget_tokens": state.get("plan", {}).get("document_budget_tokens"),
            "document_share": state.get("document_share"),
            "target_step_ms": state.get("target_step_ms"),
            "scheduler": {k: v for k, v in state.items() if k not in ("waiting", "prefill", "reservations")},
        }

    def activity(self) -> dict[str, Any]:
        """What a process beside the engine asks often and cheaply (the ingest's embedder, to
        choose its CPU class): the drafting requests in this host, in the engine or about to
        enter it (``stats``' ``drafting_requests`` counts those in the engine only), and the
        seconds since the last one ended (0 while any is here; None if none has run since the
        host started)."""
        drafting = sum(1 for run in self.runs.values() if run.request.drafting)
        ended = self.drafting_ended_at
        idle_s = 0.0 if drafting else (None if ended is None else round(time.monotonic() - ended, 3))
        return {"device": self.info.get("device"), "drafting_requests": drafting, "drafting_idle_s": idle_s}

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's control tokens around each message's content as plain text: a
        document's literal "<|im_end|>" never ends its message (``chat_tokens``)."""
        return prompt_token_ids(self.tokenizer, messages)

    def request_token_ids(self, request: GenerateRequest) -> list[int]:
        """The prompt of ``request``: its messages in the chat template, or its raw prompt
        (``chat_tokens.raw_prompt_token_ids``)."""
        if request.prompt:
            return raw_prompt_token_ids(self.tokenizer, request.prompt)
        return self.prompt_token_ids(request.messages)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if not line:
                return
            message = decode(line)
            op = message.get("op")
            if self.config.token and not hmac.compare_digest(
                str(message.get("auth", "")).encode(), self.config.token.encode()
            ):
                logger.warning("engine host: refused a request without its token (op %r)", op)
                writer.write(encode({"type": "error", "code": ErrorCode.UNAUTHORIZED, "detail": "not authenticated"}))
            elif op in BENCHMARK_OPS and not self.config.benchmark_ops:
                detail = f"{op} is served only by an engine host a benchmark started"
                writer.write(encode({"type": "error", "code": ErrorCode.FORBIDDEN, "detail": detail}))
            elif op == "stats":
                writer.write(encode({"type": "stats", **self.snapshot()}))
            elif op == "activity":
                writer.write(encode({"type": "activity", **self.activity()}))
            elif op == "count_tokens":  # the tokenizer lives in this process: works while restarting
                prompts = message.get("prompts", [])
                counts = await asyncio.to_thread(lambda: [len(self.prompt_token_ids(m)) for m in prompts])
                writer.write(encode({"type": "counts", "counts": counts}))
            elif self.state != EngineState.READY or self.engine is None:
                writer.write(encode(self._restarting_error(in_flight=False)))
            elif op == "abort":
                await self.engine.abort(str(message.get("request_id")))
                writer.write(encode({"type": "aborted"}))
            elif op == "set_scheduling":
                writer.write(encode({"type": "scheduling", **await self._set_scheduling(message)}))
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
            writer.write(encode({"type": "error", "code": ErrorCode.PROTOCOL, "detail": str(exc)}))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # the host keeps serving whatever one request does
            logger.exception("request failed")
            with contextlib.suppress(Exception):
                writer.write(
                    encode({"type": "error", "code": ErrorCode.ENGINE, "detail": f"{type(exc).__name__}: {exc}"})
                )
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
                writer.close()

    async def _set_scheduling(self, message: dict[str, Any]) -> dict[str, Any]:
        """Benchmarks: switch the policy (``appliance``, ``engine`` or ``fifo``) and any of the
        scheduler's settings (``PolicyConfig``) on the running engine; ``forget_output_lengths``:
        the ``predicted`` reservation starts learning again (a benchmark run whose workload is
        not the one before)."""
        settings = dict(message.get("settings") or {})
        if message.get("scheduling") is not None:
            settings["mode"] = str(message["scheduling"])
        try:
            policy = self.policy.updated(settings)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad scheduling settings: {exc}") from None
        if message.get("forget_output_lengths"):
            await self._scheduler_call("forget_output_lengths")
        # The scheduler's state as it is now, not as last polled: a reservation made in the next
        # second reads its prediction.
        self.scheduler_state = await self._scheduler_call("configure", policy.to_dict())
        self.policy = policy
        logger.info("scheduling is now %s", policy.to_dict())
        return {"scheduling": str(policy.mode), "settings": policy.to_dict()}

    async def _generate(
        self, request: GenerateRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Tokenising a long document takes a while: off the loop, so that streams keep flowing.
        prompt_ids = await asyncio.to_thread(self.request_token_ids, request)
        max_len = self.info["max_model_len"]
        if len(prompt_ids) + request.max_tokens > max_len:
            detail = (
                f"the prompt has {len(prompt_ids)} tokens and asks for {request.max_tokens} more; "
                f"the model's context holds {max_len}"
            )
            writer.write(encode({"type": "error", "code": ErrorCode.TOO_LONG, "detail": detail}))
            return
        mode = self.policy.mode
        if mode is Mode.APPLIANCE:
            refused = refusal(
                len(prompt_ids),
                request.max_tokens,
                drafting=request.drafting,
                total_blocks=int(self.info["kv_blocks"]) - 1,
                block_size=int(self.info["kv_block_size"]),
                config=self.policy,
            )
            if refused:
                writer.write(encode({"type": "error", "code": ErrorCode.KV_BUDGET, "detail": refused}))
                return
        if request.request_id in self.runs:
            raise ProtocolError(f"request {request.request_id!r} is already running")
        run = _Run(request=request, prompt_ids=prompt_ids, mode=mode)
        self.runs[request.request_id] = run
        # The connection is the request: when the client goes away, give everything back.
        gone = asyncio.create_task(reader.read(1))
        work = asyncio.create_task(self._run_isolated(run, writer) if request.suspect else self._run(run, writer))
        ticker = asyncio.create_task(self._report_waiting(run, writer))
        try:
            done, _ = await asyncio.wait({gone, work}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:  # client gone
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                if run.in_engine and self.engine is not None:
                    await self.engine.abort(request.request_id)
            else:
                work.result()
        finally:
            gone.cancel()
            ticker.cancel()
            self.runs.pop(request.request_id, None)
            if request.drafting:
                self.drafting_ended_at = time.monotonic()

    async def _run_isolated(self, run: _Run, writer: asyncio.StreamWriter) -> None:
        """A suspect runs only while no other suspect does."""
        if self._suspect_turn is None:
            self._suspect_turn = asyncio.Lock()
        run.isolated_wait = True
        async with self._suspect_turn:
            run.isolated_wait = False
            await self._run(run, writer)

    async def _run(self, run: _Run, writer: asyncio.StreamWriter) -> None:
        from vllm import SamplingParams, TokensPrompt
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.exceptions import EngineDeadError

        request, prompt_ids = run.request, run.prompt_ids
        engine = self.engine
        if engine is not None and engine.errored:
            self._engine_died(engine)
        if engine is None or self.state != EngineState.READY:
            writer.write(encode(self._restarting_error(in_flight=False)))
            return
        writer.write(
            encode(
                {
                    "type": "admitted",
                    "prompt_tokens": len(prompt_ids),
                    "kv_reservation_tokens": self._reservation_tokens(run),
                    "admission_wait_ms": 0.0,  # the wait for KV blocks is in the engine: see "done"
                    "engine": platform.node(),
                    "model": self.info["model"],
                    "scheduling": str(run.mode),
                }
            )
        )
        await writer.drain()
        priority = request.priority if run.mode is not Mode.FIFO else Priority.DECODE
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            frequency_penalty=request.frequency_penalty,
            seed=request.seed,
            stop=request.stop or None,
            ignore_eos=request.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            # An empty schema ({}) is one too: any JSON value, as vLLM reads it.
            structured_outputs=(
                StructuredOutputsParams(json=request.json_schema) if request.json_schema is not None else None
            ),
            extra_args={"appliance": {"id": request.request_id, "user": request.user}},
            **request.extras.sampling_params(),
        )
        prompt: TokensPrompt = {"prompt_token_ids": prompt_ids}
        if request.cache_salt:
            prompt["cache_salt"] = request.cache_salt
        outputs = engine.generate(prompt, params, request.request_id, priority=priority)
        output_tokens = 0
        finished = False
        run.in_engine = True
        try:
            # aclosing: if the client leaves mid-stream, vLLM's generator is closed (and the
            # request aborted) now, not whenever it is garbage-collected.
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if run.first_token_at is None:
                        run.first_token_at = time.time()
                    completion = output.outputs[0]
                    output_tokens += len(completion.token_ids)
                    failed = output.finished and completion.finish_reason == "error"
                    if (completion.text or completion.token_ids) and not failed:
                        delta = {"type": "delta", "text": completion.text, "tokens": len(completion.token_ids)}
                        if output.finished:  # the last text says why it is the last, as vLLM's server does
                            delta["finish_reason"] = completion.finish_reason
                        writer.write(encode(delta))
                        await writer.drain()
                    if failed:
                        # vLLM ended it in error and lives on: a grammar that could not be compiled
                        # against the vocabulary, or one the model's tokens broke. Not an answer.
                        finished = True
                        detail = (
                            "the engine ended this request in error (with a JSON schema: its grammar could not be "
                            "compiled for this model's vocabulary, or the answer broke it; the engine's log says which)"
                        )
                        writer.write(encode({"type": "error", "code": ErrorCode.ENGINE, "detail": detail}))
                    elif output.finished:
                        finished = True
                        self.requests_served += 1
                        writer.write(encode(self._done_message(run, output, completion, output_tokens)))
            if not finished:  # vLLM ended it (an abort): say so, or the client would take it for a death
                detail = "the engine ended this request before it finished (it was aborted)"
                writer.write(encode({"type": "error", "code": ErrorCode.ENGINE, "detail": detail}))
        except VLLMClientError as exc:
            # vLLM refused the request as it entered (a JSON schema with a keyword its grammar
            # backend does not honour, say): the request's own failure, said in vLLM's words.
            detail = f"the engine refused this request: {exc}"
            writer.write(encode({"type": "error", "code": ErrorCode.ENGINE, "detail": detail}))
        except Exception as exc:
            # The engine core died under it: not this request's own failure.
            if not (isinstance(exc, EngineDeadError) or engine.errored):
                raise
            self._engine_died(engine)
            writer.write(encode(self._restarting_error(in_flight=True)))
        finally:
            run.in_engine = False

    def _reservation_tokens(self, run: _Run) -> int:
        """What the scheduler reserves for the request (its own figure once it has started)."""
        reserved = self.scheduler_state.get("reservations", {}).get(run.request.request_id)
        if reserved is not None:
            return int(reserved)
        if run.mode is not Mode.APPLIANCE:
            return 0
        output = run.request.max_tokens
        if self.policy.reservation is Reservation.PREDICTED:
            kind = "drafting" if run.request.drafting else "document"
            guess = self.scheduler_state.get("predicted_output_tokens", {}).get(kind)
            output = min(output, int(guess)) if guess else output
        return len(run.prompt_ids) + output

    async def _report_waiting(self, run: _Run, writer: asyncio.StreamWriter) -> None:
        """Until the first token, say once a second what the request is doing (waiting to start
        in the engine and why, or reading its prompt and how far): the worker shows it to the
        user and uses it to notice a cancel."""
        request_id = run.request.request_id
        while run.first_token_at is None:
            await asyncio.sleep(WAITING_REPORT_INTERVAL_S)
            state = self.scheduler_state
            waiting = [rid for rid, _ in state.get("waiting", [])]
            message: dict[str, Any]
            if run.isolated_wait:
                message = {"type": "waiting", "reason": "engine_recovery", "position": None}
            elif request_id in waiting:
                why = dict(state.get("waiting", [])).get(request_id, "queued")
                message = {"type": "waiting", "reason": why, "position": waiting.index(request_id) + 1}
            else:
                done, total = state.get("prefill", {}).get(request_id, (None, len(run.prompt_ids)))
                message = {"type": "prefill", "tokens_done": done, "prompt_tokens": total}
            writer.write(encode(message))
            await writer.drain()

    def _done_message(self, run: _Run, output, completion, output_tokens: int) -> dict[str, Any]:
        metrics = getattr(output, "metrics", None)
        queued = float(getattr(metrics, "queued_ts", 0.0) or 0.0)
        scheduled = float(getattr(metrics, "scheduled_ts", 0.0) or 0.0)
        admission_wait_ms = (scheduled - queued) * 1000 if queued and scheduled >= queued else None
        prefill_ms = (run.first_token_at - run.submitted_at) * 1000 if run.first_token_at else None
        if prefill_ms is not None and admission_wait_ms is not None:
            prefill_ms = max(0.0, prefill_ms - admission_wait_ms)
        return {
            "type": "done",
            "finish_reason": completion.finish_reason,
            "prompt_tokens": len(run.prompt_ids),
            "output_tokens": output_tokens,
            "cached_prompt_tokens": int(output.num_cached_tokens or 0),
            "prefill_ms": round(prefill_ms, 3) if prefill_ms is not None else None,
            "admission_wait_ms": round(admission_wait_ms, 3) if admission_wait_ms is not None else None,
            "kv_reservation_tokens": self._reservation_tokens(run),
            "preemptions": int(getattr(metrics, "num_preemptions", 0) or 0),
        }

    async def _run_direct(self, message: dict[str, Any]) -> dict[str, Any]:
        """Benchmarks: run requests straight on ``AsyncLLM``, all at once, with no socket
        streaming or worker in between (under the engine's current policy): the baseline the
        appliance's path is compared to."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        requests = [GenerateRequest.from_message({"op": "generate", **m}) for m in message.get("requests", [])]
        prompts = await asyncio.to_thread(lambda: [self.request_token_ids(r) for r in requests])

        async def one(request: GenerateRequest, prompt_ids: list[int]) -> tuple[int, float, float]:
            params = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                ignore_eos=request.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
            )
            start, first, tokens = time.perf_counter(), None, 0
            async for output in self.engine.generate(
                {"prompt_token_ids": prompt_ids}, params, request.request_id, priority=request.priority
            ):
                tokens += len(output.outputs[0].token_ids)
                first = first or time.perf_counter()
            return tokens, (first or start) - start, time.perf_counter() - start

        started = time.perf_counter()
        results = await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts, strict=True)))
        return {
            "output_tokens": sum(r[0] for r in results),
            "ttft_s": [round(r[1], 4) for r in results],
            "finished_s": [round(r[2], 4) for r in results],
            "elapsed_s": round(time.perf_counter() - started, 4),
        }

    # --- serving -----------------------------------------------------------------------------

    async def _tcp_server(self) -> asyncio.Server | None:
        """The TCP listener of ``listen`` (other nodes' workers), with TLS when a certificate is
        given; refused without a token, or in clear text beyond the loopback address."""
        if not self.config.listen:
            return None
        host, port = parse_host_port(self.config.listen, what="APPLIANCE_ENGINE_LISTEN")
        check_listen(host, tls=bool(self.config.tls_cert), token=self.config.token)
        context = None
        if self.config.tls_cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self.config.tls_cert, self.config.tls_key or None)
        server = await asyncio.start_server(self.handle, host, port, ssl=context, limit=MAX_LINE_BYTES)
        logger.info("engine host listening on %s://%s:%d", "tls" if context else "tcp", host, port)
        return server

    async def serve(self) -> None:
        path = self.config.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # an existing directory is left as it is
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by a host that died
        server = await asyncio.start_unix_server(self.handle, path=str(path), limit=MAX_LINE_BYTES)
        os.chmod(path, 0o600)  # the appliance's own user only; the token is asked as well
        tcp = await self._tcp_server()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        background = [asyncio.create_task(self._watch_engine()), asyncio.create_task(self._poll_scheduler())]
        logger.info("engine host listening on %s", path)
        async with server:
            await stop.wait()
        if tcp is not None:
            tcp.close()
            await tcp.wait_closed()
        logger.info("engine host stopping")
        for task in background:
            task.cancel()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        engine, self.engine = self.engine, None
        if engine is not None:
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
