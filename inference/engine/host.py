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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine.admission import AdmissionRefused, KvAdmission
from inference.engine.protocol import MAX_LINE_BYTES, GenerateRequest, ProtocolError, decode, encode

logger = logging.getLogger(__name__)


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
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_gib: int = 2
    kv_safety_factor: float = 0.9
    kv_decode_reserve_fraction: float = 0.1

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
            gpu_memory_utilization=settings.APPLIANCE_GPU_MEMORY_UTILIZATION,
            cpu_kv_cache_gib=settings.APPLIANCE_CPU_KV_CACHE_GIB,
        )


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
        self.stats = _EngineStats()
        self.info: dict[str, Any] = {}
        self.started_at = time.time()
        self.requests_served = 0

    # --- start-up ------------------------------------------------------------------------

    def start_engine(self) -> None:
        import torch
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config
        args = AsyncEngineArgs(
            model=str(cfg.model),
            tokenizer=str(cfg.model),
            dtype=cfg.dtype,
            kv_cache_dtype=cfg.kv_cache_dtype,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            enable_chunked_prefill=True,
            enable_prefix_caching=True,
            scheduling_policy="priority",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            disable_log_stats=False,
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
            "prefix_caching": True,
            "scheduling_policy": "priority",
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            **_device_description(),
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
            **self.admission.snapshot(),
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

    async def _generate(self, request: GenerateRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert self.admission is not None
        # Tokenising a long document takes a while: off the loop, so that streams keep flowing.
        prompt_ids = await asyncio.to_thread(self.prompt_token_ids, request.messages)
        max_len = self.info["max_model_len"]
        if len(prompt_ids) + request.max_tokens > max_len:
            writer.write(
                encode(
                    {
                        "type": "error",
                        "code": "too_long",
                        "detail": f"the prompt has {len(prompt_ids)} tokens and asks for {request.max_tokens} more; "
                        f"the model's context holds {max_len}",
                    }
                )
            )
            return
        kv_tokens = len(prompt_ids) + request.max_tokens
        submitted = time.time()

        # The connection is the request: when the client goes away, give everything back.
        gone = asyncio.create_task(reader.read(1))
        admit = asyncio.create_task(self.admission.acquire(request.request_id, kv_tokens, request.priority))
        done, _ = await asyncio.wait({gone, admit}, return_when=asyncio.FIRST_COMPLETED)
        if admit not in done:
            admit.cancel()
            with contextlib.suppress(asyncio.CancelledError, AdmissionRefused):
                await admit
            return
        try:
            reservation = admit.result()
        except AdmissionRefused as exc:
            gone.cancel()
            writer.write(encode({"type": "error", "code": "kv_budget", "detail": str(exc)}))
            return

        admitted = time.time()
        writer.write(
            encode(
                {
                    "type": "admitted",
                    "prompt_tokens": len(prompt_ids),
                    "kv_reservation_tokens": kv_tokens,
                    "admission_wait_ms": round((admitted - submitted) * 1000, 3),
                    "engine": platform.node(),
                    "model": self.info["model"],
                }
            )
        )
        await writer.drain()
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=request.stop or None,
            output_kind=RequestOutputKind.DELTA,
        )
        generation = self._stream(request, prompt_ids, params, writer)
        stream = asyncio.create_task(generation)
        try:
            done, _ = await asyncio.wait({gone, stream}, return_when=asyncio.FIRST_COMPLETED)
            if stream not in done:  # client gone mid-stream
                stream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream
                await self.engine.abort(request.request_id)
            else:
                gone.cancel()
                stream.result()
        finally:
            self.admission.release(reservation)

    async def _stream(self, request: GenerateRequest, prompt_ids: list[int], params, writer: asyncio.StreamWriter) -> None:
        output_tokens = 0
        outputs = self.engine.generate(
            {"prompt_token_ids": prompt_ids}, params, request.request_id, priority=request.priority
        )
        # aclosing: if the client leaves mid-stream, vLLM's generator is closed (and the request
        # aborted) now, not whenever it is garbage-collected.
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                completion = output.outputs[0]
                output_tokens += len(completion.token_ids)
                if completion.text or completion.token_ids:
                    writer.write(encode({"type": "delta", "text": completion.text, "tokens": len(completion.token_ids)}))
                    await writer.drain()
                if output.finished:
                    self.requests_served += 1
                    writer.write(encode(self._done_message(output, completion, len(prompt_ids), output_tokens)))

    @staticmethod
    def _done_message(output, completion, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
        metrics = getattr(output, "metrics", None)
        return {
            "type": "done",
            "finish_reason": completion.finish_reason,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "cached_prompt_tokens": int(output.num_cached_tokens or 0),
            "preemptions": int(getattr(metrics, "num_preemptions", 0) or 0),
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
