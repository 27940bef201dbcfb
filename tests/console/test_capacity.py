"""``/console/capacity``: the capacity planner's page (staff only), its form, its presets, and the
served model's plan beside what the engine reports."""

from __future__ import annotations

import re

import pytest
from django.test import Client, override_settings

from console import selectors
from inference.capacity import GIB, ModelShape, plan, plan_kv_cache, shape_of_model_dir
from tests.factories import model_dir

pytestmark = pytest.mark.django_db

LLAMA_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "parameters": "8.03e9"}
LLAMA_70B = {"layers": 80, "kv_heads": 8, "head_dim": 128, "parameters": "70.6e9"}


@pytest.fixture
def engine_down(monkeypatch):
    monkeypatch.setattr(selectors, "engine", lambda: None)


def fake_engine_stats(**overrides) -> dict:
    """What a CPU engine host reports, as far as the planner is concerned (a fake: no engine runs)."""
    return {
        "model": "tiny", "dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "max_model_len": 4096,
        "kv_block_size": 128, "device": "cpu", "kv_capacity_tokens": 46_592, "running": 0, **overrides,
    }  # fmt: skip


def text(response) -> str:
    """The page's text without tags and with spaces collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_people_who_are_not_staff_get_neither_planner_nor_spec_sheet(django_user_model):
    gina = django_user_model.objects.create_user("gina", password="pw-gina-long-enough")
    client = Client()
    client.force_login(gina)
    for path in ("/console/capacity", "/console/specsheet", "/console/specsheet/files/specsheet-20261130T080000Z.md"):
        response = client.get(path)
        assert response.status_code == 403 and "Staff only" in response.content.decode(), path
        anonymous = Client().get(path)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/"), path


def test_llama_8b_on_24_gib_with_an_fp8_kv_cache(staff_client, engine_down):
    response = staff_client.get(
        "/console/capacity", {**LLAMA_8B, "kv_dtype": "fp8", "memory_gib": "24", "context_tokens": "8192"}
    )
    assert response.status_code == 200
    expected = plan(
        ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=8_030_000_000, kv_dtype="fp8"),
        device_memory_bytes=24 * GIB,
        context_tokens=8192,
        memory_utilization=0.9,
    )
    assert response.context["plan"] == expected
    assert expected.kv_bytes_per_token == 64 * 1024 and expected.fits and expected.max_concurrent_requests == 13
    page = text(response)
    assert "KV cache per token 64.0 KiB in fp8" in page
    assert f"Concurrent requests at that context {expected.max_concurrent_requests}" in page
    assert "Weights 16.06 GB" in page and f"= {expected.kv_capacity_tokens:,} tokens" in page
    assert 'role="status" class="state-succeeded" id="capacity-verdict"' in response.content.decode()
    assert "does not fit" not in page.lower()


def test_a_70b_model_on_24_gib_does_not_fit_and_says_why(staff_client, engine_down):
    response = staff_client.get("/console/capacity", {**LLAMA_70B, "memory_gib": "24", "context_tokens": "8192"})
    assert response.status_code == 200
    result = response.context["plan"]
    assert not result.fits and result.max_concurrent_requests == 0
    verdict = re.search(r'<p role="alert" class="error" id="capacity-verdict">(.*?)</p>', response.content.decode())
    assert verdict, "the verdict is an alert"
    assert "Does not fit:" in verdict.group(1) and "the weights (141.2 GB) do not fit in 23.2 GB" in verdict.group(1)


def test_a_70b_model_fits_an_engine_of_four_80_gib_gpus_and_the_cluster_adds_engines(staff_client, engine_down):
    query = {**LLAMA_70B, "memory_gib": "80", "context_tokens": "8192", "gpus_per_engine": "4", "engines": "3"}
    result = staff_client.get("/console/capacity", query).context["plan"]
    assert result.fits and result.gpus_per_engine == 4 and result.engines == 3
    page = text(staff_client.get("/console/capacity", query))
    assert "4 × 80.0 GiB per engine" in page
    assert (f"The cluster (3 engines) {result.cluster_kv_capacity_tokens:,} KV tokens, "
            f"{3 * result.max_concurrent_requests} concurrent requests") in page  # fmt: skip


def test_a_shape_given_in_part_is_refused_naming_what_is_missing(staff_client, engine_down):
    response = staff_client.get("/console/capacity", {"layers": "32", "head_dim": "128", "memory_gib": "24"})
    assert response.status_code == 200 and response.context["plan"] is None
    form = response.context["form"]
    assert set(form.errors) == {"kv_heads", "parameters"}
    assert "missing: kv_heads, parameters" in form.errors["kv_heads"][0]
    html = response.content.decode()
    assert 'aria-invalid="true"' in html and 'id="id_kv_heads_error"' in html


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"memory_gib": "0"}, "memory_gib"),
        ({"memory_gib": "-3"}, "memory_gib"),
        ({"memory_gib": "1e400"}, "memory_gib"),  # infinity
        ({"memory_utilization": "0"}, "memory_utilization"),
        ({"memory_utilization": "1.5"}, "memory_utilization"),
        ({"context_tokens": "0"}, "context_tokens"),
        ({"context_tokens": "9" * 40}, "context_tokens"),
        ({**LLAMA_8B, "layers": "abc"}, "layers"),
        ({**LLAMA_8B, "parameters": "nan"}, "parameters"),
        ({**LLAMA_8B, "parameters": "9e99"}, "parameters"),
        ({**LLAMA_8B, "head_dim": "99999999999999999999"}, "head_dim"),
        ({**LLAMA_8B, "kv_dtype": "fp7"}, "kv_dtype"),
        ({**LLAMA_8B, "weight_dtype": "../../etc"}, "weight_dtype"),
    ],
)
def test_values_it_cannot_plan_with_are_form_errors_not_server_errors(staff_client, engine_down, query, field):
    response = staff_client.get("/console/capacity", query)
    assert response.status_code == 200
    assert field in response.context["form"].errors and response.context["plan"] is None


def test_the_largest_values_accepted_still_make_a_plan(staff_client, engine_down):
    query = {"layers": "10000", "kv_heads": "10000", "head_dim": "65536", "parameters": "1e15",
             "weight_dtype": "float32", "kv_dtype": "float32", "memory_gib": "1000000", "context_tokens": "100000000"}  # fmt: skip
    response = staff_client.get("/console/capacity", query)
    assert response.status_code == 200 and response.context["plan"] is not None
    assert not response.context["plan"].fits
    tiny = staff_client.get("/console/capacity", {**LLAMA_8B, "memory_gib": "1e-300", "memory_utilization": "1e-9"})
    assert tiny.status_code == 200 and tiny.context["plan"].device_memory_bytes == 0  # not this machine's memory
    assert "Does not fit" in tiny.content.decode()


def test_the_empty_form_plans_the_served_model_and_compares_it_with_the_engine(staff_client, tmp_path, monkeypatch):
    served = model_dir(tmp_path / "tiny")  # 30 layers x 3 KV heads x 64 in bfloat16: 22.5 KiB a token
    monkeypatch.setattr(selectors, "engine", lambda: fake_engine_stats())
    with override_settings(APPLIANCE_MODEL=served, APPLIANCE_MAX_MODEL_LEN=4096, APPLIANCE_CPU_KV_CACHE_GIB=1):
        response = staff_client.get("/console/capacity")
    assert response.status_code == 200
    result = response.context["plan"]
    shape = shape_of_model_dir(served, kv_dtype="auto")
    assert result.shape == shape and result.context_tokens == 4096 and result.memory_utilization == 0.9
    assert result.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    page = text(response)
    assert "The served model (tiny) on" in page and "KV cache per token 22.5 KiB in bfloat16" in page
    assert "0.1 million parameters" in page
    # The planner with the engine's KV memory (1 GiB on a CPU), rounded to whole 128-token blocks.
    planned = plan_kv_cache(shape, kv_cache_bytes=GIB, context_tokens=4096).kv_capacity_tokens
    assert planned == GIB // (22.5 * 1024) and planned // 128 * 128 == 46_592
    check = response.context["check"]
    assert check["planned_tokens"] == planned and check["planned_tokens_in_blocks"] == 46_592
    assert check["difference_tokens"] == 0
    assert "APPLIANCE_CPU_KV_CACHE_GIB = 1 GiB" in page
    assert f"Planned KV capacity {planned:,} tokens; 46,592 in whole blocks of 128" in page
    assert "The engine reports 46,592 tokens (the same)" in page
    assert "KV capacity 46,592 tokens, in blocks of 128" in page


def test_the_plan_follows_the_precision_the_engine_loaded_not_the_configured_auto(staff_client, tmp_path, monkeypatch):
    # On a CPU without bfloat16 arithmetic, "auto" is loaded as float32: twice the bytes a token.
    served = model_dir(tmp_path / "tiny")
    stats = fake_engine_stats(dtype="float32", kv_cache_dtype="float32", kv_capacity_tokens=23_296)
    monkeypatch.setattr(selectors, "engine", lambda: stats)
    with override_settings(APPLIANCE_MODEL=served, APPLIANCE_MAX_MODEL_LEN=4096, APPLIANCE_CPU_KV_CACHE_GIB=1):
        response = staff_client.get("/console/capacity")
    assert response.context["plan"].kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    check = response.context["check"]
    assert check["planned_tokens_in_blocks"] == 23_296 and check["difference_tokens"] == 0
    page = text(response)
    assert "in float32 KV cache per token 45.0 KiB in float32" in page  # weights, then KV


def test_on_a_gpu_the_comparison_uses_the_gpu_memory_less_the_weights(tmp_path):
    served = model_dir(tmp_path / "tiny")
    stats = fake_engine_stats(device="cuda", device_memory_bytes=24 * GIB, kv_block_size=16, kv_capacity_tokens=1000)
    with override_settings(APPLIANCE_MODEL=served, APPLIANCE_GPU_MEMORY_UTILIZATION=0.85):
        check = selectors.served_model_check(stats)
    shape = shape_of_model_dir(served, kv_dtype="auto")
    expected = plan(shape, device_memory_bytes=24 * GIB, context_tokens=4096, memory_utilization=0.85)
    assert check["plan"] == expected and check["planned_tokens_in_blocks"] == expected.kv_capacity_tokens // 16 * 16
    assert check["difference_tokens"] == 1000 - check["planned_tokens_in_blocks"]
    assert "0.85 of the GPU's 24.0 GiB" in check["memory"]


def test_a_served_model_without_config_json_is_an_error_on_the_page(staff_client, tmp_path, engine_down):
    broken = tmp_path / "broken"
    broken.mkdir()
    with override_settings(APPLIANCE_MODEL=broken):
        response = staff_client.get("/console/capacity")
        assert response.status_code == 200 and response.context["plan"] is None
        errors = response.context["form"].non_field_errors()
        assert "could not be read" in errors[0] and "give layers, kv_heads, head_dim, parameters" in errors[0]
        assert 'role="alert" id="capacity-form-errors"' in response.content.decode()
        # A shape given by hand does not need the served model.
        assert staff_client.get("/console/capacity", {**LLAMA_8B, "memory_gib": "80"}).context["plan"].fits


def test_the_page_says_so_when_the_engine_does_not_answer(staff_client, engine_down):
    response = staff_client.get("/console/capacity", {**LLAMA_8B, "memory_gib": "80"})
    assert "The engine host does not answer" in response.content.decode() and response.context["check"] is None


def test_presets_are_links_that_keep_the_context_and_kv_precision(staff_client, engine_down):
    response = staff_client.get("/console/capacity", {"context_tokens": "32768", "kv_dtype": "fp8"})
    presets = {p["name"]: p for p in response.context["presets"]}
    assert set(presets) == {"Llama-3.1-8B", "Llama-3.1-70B", "Mistral-7B", "Qwen2.5-7B"}
    qwen_48 = next(link["url"] for link in presets["Qwen2.5-7B"]["links"] if link["memory_gib"] == 48)
    assert qwen_48.replace("&", "&amp;") in response.content.decode()
    assert "context_tokens=32768" in qwen_48 and "kv_dtype=fp8" in qwen_48
    followed = staff_client.get(qwen_48)
    result = followed.context["plan"]
    assert (result.shape.layers, result.shape.kv_heads, result.shape.parameters) == (28, 4, 7_620_000_000)
    assert result.device_memory_bytes == 48 * GIB and result.context_tokens == 32768
    assert result.kv_bytes_per_token == 2 * 28 * 4 * 128 * 1  # fp8 kept


def test_the_console_nav_links_the_new_pages(staff_client, engine_down):
    page = staff_client.get("/console/capacity").content.decode()
    assert 'href="/console/capacity" aria-current="page"' in page and 'href="/console/specsheet"' in page


@pytest.mark.integration
def test_the_page_compares_the_served_model_with_the_real_engine(staff_client, engine_host):
    """The real engine host with the real model: its KV capacity is the planner's tokens for the
    same memory, rounded down to its blocks (vLLM may keep one block back)."""
    stats = engine_host.stats()
    response = staff_client.get("/console/capacity")
    check = response.context["check"]
    assert check["engine_tokens"] == stats["kv_capacity_tokens"]
    assert -stats["kv_block_size"] <= check["difference_tokens"] <= 0
    assert response.context["engine"]["kv_cache_dtype"] == check["plan"].shape.kv_dtype
    assert f"The engine reports {stats['kv_capacity_tokens']:,} tokens" in text(response)


def test_the_engine_fields_the_console_compares_are_declared_on_engine_stats():
    from console.selectors import ENGINE_CAPACITY_FIELDS
    from inference.engine.protocol import EngineStats

    assert set(ENGINE_CAPACITY_FIELDS) <= set(EngineStats.field_names())
