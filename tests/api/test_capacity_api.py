"""``GET /api/v1/capacity``: the capacity planner over HTTP, with the same defaults as the console's
page (the served model, this machine's memory, the configured context), beside what the engine
reports."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from api.services import token_create
from console import selectors
from inference.capacity import GIB, ModelShape, plan, plan_kv_cache, shape_of_model_dir
from tests.console.test_capacity import fake_engine_stats
from tests.factories import model_dir

pytestmark = pytest.mark.django_db

LLAMA_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "parameters": "8.03e9"}


@pytest.fixture
def client(alice) -> Client:
    _, raw = token_create(user=alice, name="planner", scopes=["read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.fixture
def engine_down(monkeypatch):
    monkeypatch.setattr(selectors, "engine", lambda: None)


def problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    return response.json()


def test_llama_8b_on_24_gib_with_an_fp8_kv_cache(client, engine_down):
    response = client.get("/api/v1/capacity", {**LLAMA_8B, "kv_dtype": "fp8", "memory_gib": 24, "context_tokens": 8192})
    assert response.status_code == 200, response.content
    body = response.json()
    expected = plan(
        ModelShape(layers=32, kv_heads=8, head_dim=128, parameters=8_030_000_000, kv_dtype="fp8"),
        device_memory_bytes=24 * GIB,
        context_tokens=8192,
        memory_utilization=0.9,
    )
    assert body["kv_bytes_per_token"] == 64 * 1024
    assert body["max_concurrent_requests"] == expected.max_concurrent_requests == 13
    assert {k: v for k, v in body.items() if k != "engine"} == expected.as_dict()
    assert body["shape"] == {"layers": 32, "kv_heads": 8, "head_dim": 128, "parameters": 8_030_000_000,
                             "weight_dtype": "bfloat16", "kv_dtype": "fp8"}  # fmt: skip
    assert body["fits"] and body["engine"] is None


def test_a_70b_model_on_24_gib_does_not_fit_and_says_why(client, engine_down):
    body = client.get(
        "/api/v1/capacity", {"layers": 80, "kv_heads": 8, "head_dim": 128, "parameters": "70.6e9", "memory_gib": 24}
    ).json()
    assert body["fits"] is False and body["max_concurrent_requests"] == 0 and body["kv_budget_bytes"] == 0
    assert body["reason"] == "the weights (141.2 GB) do not fit in 23.2 GB"


def test_a_shape_given_in_part_is_a_400_naming_the_missing_fields(client, engine_down):
    body = problem(client.get("/api/v1/capacity", {"layers": 32, "parameters": "8e9"}), 400)
    assert [e["field"] for e in body["errors"]] == ["kv_heads", "head_dim"]
    assert body["detail"].startswith("kv_heads, head_dim: ") and "go together" in body["detail"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"memory_gib": 0}, "memory_gib"),
        ({"memory_gib": "inf"}, "memory_gib"),
        ({"memory_gib": "nan"}, "memory_gib"),
        ({"memory_utilization": 0}, "memory_utilization"),
        ({"memory_utilization": 1.01}, "memory_utilization"),
        ({"context_tokens": 0}, "context_tokens"),
        ({"context_tokens": "9" * 40}, "context_tokens"),
        ({**LLAMA_8B, "parameters": "1e400"}, "parameters"),
        ({**LLAMA_8B, "layers": -1}, "layers"),
        ({**LLAMA_8B, "kv_dtype": "fp7"}, "kv_dtype"),
        ({**LLAMA_8B, "weight_dtype": "auto"}, "weight_dtype"),
    ],
)
def test_values_out_of_bounds_are_400s_naming_the_field(client, engine_down, query, field):
    body = problem(client.get("/api/v1/capacity", query), 400)
    assert [e["field"] for e in body["errors"]] == [field]


def test_without_a_shape_it_plans_the_served_model_beside_the_engine(client, tmp_path, monkeypatch):
    served = model_dir(tmp_path / "tiny")
    monkeypatch.setattr(selectors, "engine", lambda: fake_engine_stats())
    with override_settings(APPLIANCE_MODEL=served, APPLIANCE_MAX_MODEL_LEN=4096, APPLIANCE_CPU_KV_CACHE_GIB=1):
        body = client.get("/api/v1/capacity", {"memory_gib": 8}).json()
    shape = shape_of_model_dir(served, kv_dtype="auto")
    assert body["shape"]["layers"] == 30 and body["kv_bytes_per_token"] == shape.kv_bytes_per_token == 23_040
    assert body["context_tokens"] == 4096 and body["device_memory_bytes"] == 8 * GIB
    planned = plan_kv_cache(shape, kv_cache_bytes=GIB, context_tokens=4096).kv_capacity_tokens
    assert body["engine"] == {
        "model": "tiny", "dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "max_model_len": 4096,
        "kv_capacity_tokens": 46_592, "kv_block_size": 128, "device": "cpu",
        "planned_kv_capacity_tokens": planned // 128 * 128,
    }  # fmt: skip
    assert body["engine"]["planned_kv_capacity_tokens"] == body["engine"]["kv_capacity_tokens"]


def test_an_unreadable_served_model_is_a_400_asking_for_a_shape(client, tmp_path, engine_down):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"num_hidden_layers": 2}')  # no heads; and no safetensors
    with override_settings(APPLIANCE_MODEL=broken):
        body = problem(client.get("/api/v1/capacity"), 400)
        assert [e["field"] for e in body["errors"]] == ["layers", "kv_heads", "head_dim", "parameters"]
        assert str(tmp_path) not in body["detail"]  # the box's paths are not the caller's business
        assert client.get("/api/v1/capacity", LLAMA_8B).status_code == 200


def test_it_needs_a_token_with_the_read_scope():
    problem(Client().get("/api/v1/capacity", LLAMA_8B), 401)
