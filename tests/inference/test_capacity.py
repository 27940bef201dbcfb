"""The capacity planner (``inference.capacity``) against figures known from elsewhere,
and against what the running engine reports for the served model."""

from __future__ import annotations

import dataclasses
import json
import struct
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command

from inference.capacity import ModelShape, plan, safetensors_parameters, shape_from_config, shape_of_model_dir

GIB = 1024**3
LLAMA_31_8B_CONFIG = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "torch_dtype": "bfloat16",
}
LLAMA_31_8B_PARAMETERS = 8_030_261_248


def test_llama_31_8b_needs_128_kib_of_kv_per_token_in_bf16_64_in_fp8_and_16_gb_of_weights():
    bf16 = shape_from_config(LLAMA_31_8B_CONFIG, parameters=LLAMA_31_8B_PARAMETERS)
    fp8 = shape_from_config(LLAMA_31_8B_CONFIG, parameters=LLAMA_31_8B_PARAMETERS, kv_dtype="fp8")
    assert (bf16.head_dim, bf16.kv_heads) == (128, 8)  # head size from hidden / heads; grouped KV heads
    assert bf16.kv_bytes_per_token == 128 * 1024
    assert fp8.kv_bytes_per_token == 64 * 1024
    assert 15.9e9 < bf16.weight_bytes < 16.2e9
    assert shape_from_config(LLAMA_31_8B_CONFIG, parameters=1, kv_dtype="auto").kv_dtype == "bfloat16"


def test_concurrent_requests_follow_from_the_memory_left_after_the_weights():
    shape = ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=LLAMA_31_8B_PARAMETERS)
    on_80 = plan(shape, device_memory_bytes=80 * GIB, context_tokens=8192, memory_utilization=0.9)
    budget = int(80 * GIB * 0.9) - shape.weight_bytes
    assert on_80.kv_capacity_tokens == budget // (128 * 1024)
    assert on_80.max_concurrent_requests == on_80.kv_capacity_tokens // 8192 and on_80.fits
    fp8 = plan(
        ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=LLAMA_31_8B_PARAMETERS, kv_dtype="fp8"),
        device_memory_bytes=80 * GIB,
        context_tokens=8192,
    )
    assert fp8.max_concurrent_requests in (2 * on_80.max_concurrent_requests, 2 * on_80.max_concurrent_requests + 1)


def test_a_configuration_that_cannot_fit_is_flagged_with_the_reason():
    seventy_b = ModelShape(layers=80, kv_heads=8, head_dim=128, parameters=70_600_000_000)
    no_room = plan(seventy_b, device_memory_bytes=24 * GIB, context_tokens=8192)
    assert not no_room.fits and no_room.max_concurrent_requests == 0 and "weights" in no_room.reason
    eight_b = ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=LLAMA_31_8B_PARAMETERS)
    too_long = plan(eight_b, device_memory_bytes=20 * GIB, context_tokens=131_072)
    assert not too_long.fits and "KV cache" in too_long.reason
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelShape(layers=1, kv_heads=1, head_dim=1, parameters=1, kv_dtype="fp7").kv_bytes_per_token


def test_an_engine_of_several_gpus_holds_a_model_one_cannot_and_engines_add_up():
    seventy_b = ModelShape(layers=80, kv_heads=8, head_dim=128, parameters=70_600_000_000)
    one = plan(seventy_b, device_memory_bytes=80 * GIB, context_tokens=8192, memory_utilization=0.9)
    assert not one.fits  # 141 GB of weights on one 80 GiB GPU
    four = plan(seventy_b, device_memory_bytes=80 * GIB, context_tokens=8192, memory_utilization=0.9,
                gpus_per_engine=4, engines=2)  # fmt: skip
    budget = int(4 * 80 * GIB * 0.9) - seventy_b.weight_bytes  # tensor parallel: weights and KV over 4 GPUs
    assert four.fits and four.kv_capacity_tokens == budget // seventy_b.kv_bytes_per_token
    assert four.cluster_kv_capacity_tokens == 2 * four.kv_capacity_tokens
    assert four.cluster_max_concurrent_requests == 2 * four.max_concurrent_requests
    assert f"{2 * four.max_concurrent_requests} on 2 engines" in four.reason
    with pytest.raises(ValueError, match="at least 1"):
        plan(seventy_b, device_memory_bytes=80 * GIB, context_tokens=8192, engines=0)


def test_parameters_are_counted_from_safetensors_headers(tmp_path):
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [5], "data_offsets": [24, 34]},
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 34)
    assert safetensors_parameters(tmp_path) == 17
    with pytest.raises(ValueError, match="no .safetensors"):
        safetensors_parameters(tmp_path / "nothing")


def test_the_command_prints_the_plan():
    out = StringIO()
    call_command(
        "capacity", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params", "8.03e9",
        "--kv-dtype", "bfloat16", "--memory-gib", "24", "--context", "8192", stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "KV per token     128.0 KiB (bfloat16)" in text and "weights          16.06 GB" in text
    out = StringIO()
    call_command("capacity", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--params", "70.6e9",
                 "--memory-gib", "24", stdout=out)  # fmt: skip
    assert "does not fit" in out.getvalue()
    out = StringIO()
    call_command("capacity", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--params", "70.6e9",
                 "--memory-gib", "80", "--gpus-per-engine", "4", "--engines", "3", stdout=out)  # fmt: skip
    text = out.getvalue()
    assert "4 x 80.0 GiB per engine" in text and "cluster          3 engine(s)" in text and "does not fit" not in text


@pytest.mark.integration
def test_the_planner_agrees_with_the_engine_on_the_served_model(engine_host):
    """On CPU the engine holds ``APPLIANCE_CPU_KV_CACHE_GIB`` of KV cache: the planner's bytes per
    token must turn that into the tokens the engine reports (to within one block)."""
    from inference.engine.host import _cpu_flags, cpu_weight_dtype

    stats = engine_host.stats()
    dtype, _ = cpu_weight_dtype(settings.APPLIANCE_DTYPE, _cpu_flags())  # the weights' dtype on this CPU
    shape = shape_of_model_dir(settings.APPLIANCE_MODEL, weight_dtype=dtype, kv_dtype=settings.APPLIANCE_KV_CACHE_DTYPE)
    planned_tokens = settings.APPLIANCE_CPU_KV_CACHE_GIB * GIB // shape.kv_bytes_per_token
    assert planned_tokens - stats["kv_block_size"] <= stats["kv_capacity_tokens"] <= planned_tokens
    assert shape.weight_dtype == stats["dtype"] == stats["kv_cache_dtype"]  # KV "auto": the weights' dtype


def test_gpu_defaults_come_from_the_planner_not_from_the_cpu():
    from inference.capacity import KNOWN_SHAPES, gpu_engine_defaults

    llama = KNOWN_SHAPES["Llama-3.1-8B"]
    small = gpu_engine_defaults(llama, device_memory_bytes=24 * GIB)
    large = gpu_engine_defaults(llama, device_memory_bytes=80 * GIB)
    # 24 GiB: all but 1.5 GiB for the runtime; ~8 GB of KV at 128 KiB a token: ~29 requests of 2k.
    assert small.gpu_memory_utilization == 0.93
    assert small.max_num_seqs == 24
    # 80 GiB: capped at 95 %; room for ~240 such requests.
    assert large.gpu_memory_utilization == 0.95
    assert large.max_num_seqs == 240 and large.kv_capacity_tokens > 8 * small.kv_capacity_tokens
    # fp8 KV halves the bytes per token: twice the requests.
    fp8 = gpu_engine_defaults(dataclasses.replace(llama, kv_dtype="fp8"), device_memory_bytes=24 * GIB)
    assert fp8.max_num_seqs == 56 and "max_num_seqs 56" in fp8.reason
    # The ingest's embedder on the same GPU (APPLIANCE_EMBEDDING_DEVICE=cuda): its share is left out.
    beside = gpu_engine_defaults(llama, device_memory_bytes=24 * GIB, reserve_bytes=int(2.5 * GIB))
    assert beside.gpu_memory_utilization == 0.89 and beside.kv_capacity_tokens < small.kv_capacity_tokens


def test_the_engine_leaves_the_gpu_embedder_its_share_only_when_the_ingest_embeds_there(settings):
    from inference.engine.host import EngineConfig

    settings.APPLIANCE_EMBEDDING_GPU_MEMORY_MB = 1024
    settings.APPLIANCE_EMBEDDING_DEVICE = "cpu"
    assert EngineConfig.from_settings().embedding_gpu_bytes == 0
    settings.APPLIANCE_EMBEDDING_DEVICE = "cuda"
    assert EngineConfig.from_settings().embedding_gpu_bytes == GIB


def test_a_kv_capacity_must_hold_one_whole_context_beside_vllms_reserved_block():
    from inference.engine.host import check_kv_capacity

    check_kv_capacity(8192 + 128, max_model_len=8192, block=128)  # 65 blocks: one held back, 64 for a request
    check_kv_capacity(24576, max_model_len=8192, block=128)
    with pytest.raises(ValueError, match="give at least 8320"):
        check_kv_capacity(8192, max_model_len=8192, block=128)  # vLLM refused this one with a traceback
    with pytest.raises(ValueError, match="give at least 1024"):  # 63 blocks of 16, and one
        check_kv_capacity(1000, max_model_len=1000, block=16)
