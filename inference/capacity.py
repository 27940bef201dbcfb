"""Capacity planner (pure): from a model's shape and a device's memory, the weight memory, the KV
cache's bytes per token, and how many requests of a given context fit at once.

KV bytes per token = 2 (K and V) x layers x KV heads x head size x bytes per KV element. For
Llama-3.1-8B (32 layers, 8 KV heads, head size 128) that is 128 KiB in bf16 and 64 KiB in fp8;
its 8.0 billion parameters take about 16 GB in bf16.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3

# Bytes per element of the dtypes a weight or a KV cache is stored in.
DTYPE_BYTES = {
    "float32": 4.0,
    "fp32": 4.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "half": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1}
# The four numbers a shape given by hand needs: all of them, or none (then: the served model's).
SHAPE_FIELDS = ("layers", "kv_heads", "head_dim", "parameters")
# Bounds of what the console's form and the API accept: every figure stays finite and meaningful
# within them (the largest models have ~130 layers and ~10^12 parameters; devices a few hundred GiB).
MAX_LAYERS = 10_000
MAX_KV_HEADS = 10_000
MAX_HEAD_DIM = 65_536
MAX_PARAMETERS = 1e15
MAX_MEMORY_GIB = 1_000_000
MAX_CONTEXT_TOKENS = 100_000_000


class ShapeError(ValueError):
    """A shape that cannot be planned; ``fields`` names the inputs to give or correct."""

    def __init__(self, message: str, fields: tuple[str, ...] | list[str]) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    parameters: int
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"

    @property
    def kv_bytes_per_token(self) -> int:
        return int(2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(self.kv_dtype))

    @property
    def weight_bytes(self) -> int:
        return int(self.parameters * dtype_bytes(self.weight_dtype))


# Well-known shapes (from each model's config.json and parameter count): the planner's presets.
KNOWN_SHAPES = {
    "Llama-3.1-8B": ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=8_030_000_000),
    "Llama-3.1-70B": ModelShape(layers=80, kv_heads=8, head_dim=128, parameters=70_600_000_000),
    "Mistral-7B": ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=7_240_000_000),
    "Qwen2.5-7B": ModelShape(layers=28, kv_heads=4, head_dim=128, parameters=7_620_000_000),
}


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    device_memory_bytes: int
    memory_utilization: float
    context_tokens: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int  # what is left for the KV cache after the weights
    kv_capacity_tokens: int
    max_concurrent_requests: int  # of ``context_tokens`` each, all at once
    fits: bool
    reason: str
    # The topology: each engine spreads the model over ``gpus_per_engine`` GPUs of
    # ``device_memory_bytes`` each (tensor parallel); the figures above are per engine, these for
    # ``engines`` engines (all nodes).
    gpus_per_engine: int = 1
    engines: int = 1
    cluster_kv_capacity_tokens: int = 0
    cluster_max_concurrent_requests: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": asdict(self.shape)}


def plan(
    shape: ModelShape,
    *,
    device_memory_bytes: int,
    context_tokens: int,
    memory_utilization: float = 0.9,
    gpus_per_engine: int = 1,
    engines: int = 1,
) -> Plan:
    """What fits in one engine: the share ``memory_utilization`` of its devices (``gpus_per_engine``
    of ``device_memory_bytes`` each: tensor parallelism splits the weights and the KV cache over
    them) holds the weights, and the rest of it the KV cache (activations and the runtime take the
    remainder); and what ``engines`` such engines hold together."""
    if context_tokens < 1:
        raise ValueError("context_tokens must be at least 1")
    if gpus_per_engine < 1 or engines < 1:
        raise ValueError("gpus_per_engine and engines must be at least 1")
    usable = int(device_memory_bytes * gpus_per_engine * memory_utilization)
    budget = usable - shape.weight_bytes
    per_token = shape.kv_bytes_per_token
    capacity = max(0, budget // per_token) if per_token else 0
    concurrent = capacity // context_tokens
    if budget <= 0:
        reason = f"the weights ({shape.weight_bytes / 1e9:.1f} GB) do not fit in {usable / 1e9:.1f} GB"
    elif concurrent < 1:
        reason = f"one request of {context_tokens:,} tokens needs {per_token * context_tokens / 1e9:.2f} GB of KV cache; {budget / 1e9:.2f} GB is left"
    else:
        reason = f"{concurrent} requests of {context_tokens:,} tokens at once"
    if engines > 1 and concurrent >= 1:
        reason += f" per engine; {concurrent * engines} on {engines} engines"
    return Plan(
        shape=shape,
        device_memory_bytes=device_memory_bytes,
        memory_utilization=memory_utilization,
        context_tokens=context_tokens,
        weight_bytes=shape.weight_bytes,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=max(0, budget),
        kv_capacity_tokens=capacity,
        max_concurrent_requests=concurrent,
        fits=concurrent >= 1,
        reason=reason,
        gpus_per_engine=gpus_per_engine,
        engines=engines,
        cluster_kv_capacity_tokens=capacity * engines,
        cluster_max_concurrent_requests=concurrent * engines,
    )


# What a GPU needs outside vLLM's share of its memory: the CUDA context, activations and the
# sampler's buffers vLLM does not count, and the embedder when it shares the device.
GPU_RUNTIME_RESERVE_BYTES = int(1.5 * GIB)
MAX_GPU_MEMORY_UTILIZATION = 0.95
# The size of a request the batch is sized for: a drafted reply (a letter and passages in, a reply
# out) or a document section's chunk beside it; longer ones are fewer, and admission holds them.
TYPICAL_REQUEST_TOKENS = 2048


@dataclass(frozen=True)
class EngineDefaults:
    gpu_memory_utilization: float
    max_num_seqs: int
    kv_capacity_tokens: int
    reason: str


def gpu_engine_defaults(
    shape: ModelShape, *, device_memory_bytes: int, typical_request_tokens: int = TYPICAL_REQUEST_TOKENS,
    reserve_bytes: int = GPU_RUNTIME_RESERVE_BYTES,
) -> EngineDefaults:  # fmt: skip
    """The engine settings a GPU box starts with when the operator sets none, from the planner
    rather than copied from the CPU: vLLM's share of the GPU is all of it but what the runtime
    needs beside (at most 95 %), and the batch holds as many requests as the KV cache has room
    for at ``typical_request_tokens`` each (between 8 and 256, a multiple of 8)."""
    utilization = min(MAX_GPU_MEMORY_UTILIZATION, 1.0 - reserve_bytes / device_memory_bytes)
    utilization = max(0.5, int(utilization * 100) / 100)
    planned = plan(
        shape, device_memory_bytes=device_memory_bytes, context_tokens=typical_request_tokens,
        memory_utilization=utilization,
    )  # fmt: skip
    seqs = max(8, min(256, planned.max_concurrent_requests // 8 * 8))
    return EngineDefaults(
        gpu_memory_utilization=utilization,
        max_num_seqs=seqs,
        kv_capacity_tokens=planned.kv_capacity_tokens,
        reason=(
            f"{utilization:.2f} of {device_memory_bytes / GIB:.0f} GiB for vLLM; {planned.kv_capacity_tokens:,} KV tokens "
            f"hold {planned.max_concurrent_requests} requests of {typical_request_tokens:,} tokens: max_num_seqs {seqs}"
        ),
    )


def plan_kv_cache(shape: ModelShape, *, kv_cache_bytes: int, context_tokens: int) -> Plan:
    """What fits in a KV cache of a fixed size (a CPU engine's ``VLLM_CPU_KVCACHE_SPACE``): the
    plan of a device that holds exactly the weights and ``kv_cache_bytes``, all of it used."""
    return plan(
        shape,
        device_memory_bytes=shape.weight_bytes + kv_cache_bytes,
        context_tokens=context_tokens,
        memory_utilization=1.0,
    )


def shape_of(
    *,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    parameters: float | None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
) -> ModelShape | None:
    """A shape given by hand: None when none of its numbers is given; ``ShapeError`` naming the
    missing ones when only some are, or an unknown dtype. ``kv_dtype`` None or "auto" is the
    weights' (as vLLM's "auto")."""
    given = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "parameters": parameters}
    missing = [name for name, value in given.items() if value is None]
    if len(missing) == len(given):
        return None
    if missing:
        raise ShapeError(f"{', '.join(SHAPE_FIELDS)} go together; missing: {', '.join(missing)}", missing)
    assert layers is not None and kv_heads is not None and head_dim is not None and parameters is not None
    weights = weight_dtype or "bfloat16"
    shape = ModelShape(
        layers=int(layers), kv_heads=int(kv_heads), head_dim=int(head_dim), parameters=int(parameters),
        weight_dtype=weights, kv_dtype=weights if kv_dtype in (None, "", "auto") else kv_dtype,
    )  # fmt: skip
    for field, dtype in (("weight_dtype", shape.weight_dtype), ("kv_dtype", shape.kv_dtype)):
        try:
            dtype_bytes(dtype)  # an unknown dtype fails here, not in plan()
        except ValueError as exc:
            raise ShapeError(str(exc), [field]) from None
    return shape


def shape_from_config(
    config: dict[str, Any], *, parameters: int, weight_dtype: str | None = None, kv_dtype: str | None = None
) -> ModelShape:
    """A Hugging Face ``config.json``'s shape (Llama, Mistral, Qwen and their kin)."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    weights = weight_dtype or str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return ModelShape(
        layers=int(config["num_hidden_layers"]),
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        parameters=int(parameters),
        weight_dtype=weights,
        kv_dtype=kv_dtype if kv_dtype and kv_dtype != "auto" else weights,  # vLLM's "auto": the weights'
    )


def safetensors_parameters(model_dir: Path) -> int:
    """Parameters counted from the safetensors headers (no tensor is read)."""
    total = 0
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {model_dir}")
    for path in files:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for size in tensor["shape"]:
                count *= int(size)
            total += count
    return total


def shape_of_model_dir(model_dir: Path, *, weight_dtype: str | None = None, kv_dtype: str | None = None) -> ModelShape:
    """``weight_dtype``: the precision the weights are loaded in (None or "auto": the config's)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return shape_from_config(
        config,
        parameters=safetensors_parameters(model_dir),
        weight_dtype=None if weight_dtype == "auto" else weight_dtype,
        kv_dtype=kv_dtype,
    )
