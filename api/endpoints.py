"""``/api/v1/usage``, ``/api/v1/engine``, ``/api/v1/capacity`` and ``/api/v1/admin/usage``: what
the caller used, what the box runs, what a model would fit on a device, and (staff, admin scope)
everyone's usage."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from django.utils import timezone
from ninja import Field, Query, Router, Schema

from api import auth
from api.models import ApiToken
from api.problems import ApiProblem, responses
from console import selectors as console_selectors
from inference import selectors as job_selectors
from inference.capacity import (
    GIB,
    MAX_CONTEXT_TOKENS,
    MAX_HEAD_DIM,
    MAX_KV_HEADS,
    MAX_LAYERS,
    MAX_MEMORY_GIB,
    MAX_PARAMETERS,
    ShapeError,
)
from inference.engine.protocol import EngineStats

router = Router()

# Which engine fields the API shows is declared on EngineStats (its ``api`` metadata); software
# versions, which tell an attacker which known flaws to try, to staff only.
ENGINE_FIELDS = EngineStats.api_fields(staff=False)
ENGINE_STAFF_FIELDS = tuple(name for name in EngineStats.api_fields(staff=True) if name not in ENGINE_FIELDS)
SPECSHEET_STAFF_FIELDS = {
    "engine": ENGINE_STAFF_FIELDS,
    "hardware": ("driver", "cuda", "vllm", "torch", "python", "platform"),
}


def _without_versions(sheet: dict) -> dict:
    """The spec sheet as anyone with a read token sees it: no software versions."""
    from inference import specsheet

    out = dict(sheet)
    for section, names in SPECSHEET_STAFF_FIELDS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in names}
    if isinstance(out.get("answers"), list):
        try:
            out["answers"] = specsheet.answers(out)  # the hardware answer named the versions
        except (KeyError, TypeError, ValueError):
            out["answers"] = [a for a in out["answers"] if not (isinstance(a, dict) and a.get("key") == "hardware")]
    return out


class UsageRow(Schema):
    requests: int = Field(description="Jobs asked for (chat completions included), whatever became of them.")
    engine_requests: int
    prompt_tokens: int
    output_tokens: int


class KindUsage(UsageRow):
    kind: str


class TokenUsage(UsageRow):
    token: str | None = Field(description="The token's name and prefix; null for the browser and other sessions.")


class UserUsage(UsageRow):
    user: str


class CallerUsage(UsageRow):
    since: datetime
    by_kind: list[KindUsage]
    by_token: list[TokenUsage]


class EveryonesUsage(Schema):
    since: datetime
    by_user: list[UserUsage]
    by_token: list[TokenUsage]


class EngineOut(Schema):
    up: bool = Field(description="False when the engine host does not answer; the other fields are then null.")
    model: str | None = None
    licence: str | None = None
    dtype: str | None = Field(None, description="Precision of the weights.")
    kv_cache_dtype: str | None = Field(None, description="Precision of the KV cache.")
    max_model_len: int | None = Field(None, description="Context length configured, in tokens.")
    kv_capacity_tokens: int | None = None
    kv_block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = Field(None, description="Share of the KV cache in use, 0 to 1.")
    prefix_cache_hit_rate: float | None = None
    preemptions: int | None = None
    requests_served: int | None = None
    uptime_s: float | None = None
    scheduling: str | None = None
    vllm_version: str | None = Field(None, description="Staff only.")
    torch_version: str | None = Field(None, description="Staff only.")
    specsheet: dict | None = Field(
        None, description="The latest spec sheet `manage.py specsheet` measured on this box, if any."
    )


def _requests(row: dict, *, group: str | None = None, as_name: str = "") -> dict:
    """A usage row as the API has always named it: the jobs asked for are ``requests``, and the
    group's field (``group``) is called ``as_name``."""
    renamed = {"jobs": "requests", group: as_name} if group else {"jobs": "requests"}
    return {renamed.get(key, key): value for key, value in row.items()}


def _by_token(*, since, owner=None) -> list[dict]:
    rows = job_selectors.usage(since=since, owner=owner, group="api_token")
    labels = {t.pk: str(t) for t in ApiToken.objects.filter(pk__in=[r["api_token"] for r in rows])}
    return [
        {**_requests(row, group="api_token", as_name="token"), "token": labels.get(row["api_token"])} for row in rows
    ]


@router.get("/usage", response=responses(ok={200: CallerUsage}), auth=auth.READ, tags=["usage"], summary="Your usage")
def usage(request, days: int = Query(30, ge=1, le=366, description="How many days back.")):
    """What you asked of the appliance over the window: requests and tokens in and out, by kind
    and by token (the browser counts as no token)."""
    since = timezone.now() - timedelta(days=days)
    mine = {"since": since, "owner": request.user}
    return {
        "since": since,
        **_requests(job_selectors.usage(**mine)),
        "by_kind": [_requests(row) for row in job_selectors.usage(**mine, group="kind")],
        "by_token": _by_token(**mine),
    }


@router.get(
    "/admin/usage",
    response=responses(403, ok={200: EveryonesUsage}),
    auth=auth.ADMIN,
    tags=["usage"],
    summary="Everyone's usage",
)
def all_usage(request, days: int = Query(30, ge=1, le=366)):
    """Staff, with the admin scope: requests and tokens per user and per API token."""
    since = timezone.now() - timedelta(days=days)
    by_user = job_selectors.usage(since=since, group="owner__username")
    return {
        "since": since,
        "by_user": [_requests(row, group="owner__username", as_name="user") for row in by_user],
        "by_token": [row for row in _by_token(since=since) if row["token"] is not None],
    }


@router.get("/engine", response=responses(ok={200: EngineOut}), auth=auth.READ, tags=["engine"], summary="The engine")
def engine(request):
    """The model, its licence, the precision of weights and KV cache, the context length, the KV
    capacity and its live use, and the latest spec sheet: what a buyer asks, from the box itself."""
    staff = request.user.is_staff
    stats = console_selectors.engine()
    sheet = console_selectors.latest_specsheet()
    if sheet is not None and not staff:
        sheet = _without_versions(sheet)
    out = {"up": stats is not None, "specsheet": sheet}
    if stats:
        engine_stats = EngineStats.from_message(stats)
        out.update({name: getattr(engine_stats, name) for name in EngineStats.api_fields(staff=staff)})
    return out


# Written out so that a type checker reads them; tests/api/test_api_types.py keeps them equal to
# inference.capacity.DTYPE_BYTES.
Dtype = Literal[
    "float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "half", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4"
]
KvDtype = Literal["auto", Dtype]


class CapacityShape(Schema):
    layers: int
    kv_heads: int
    head_dim: int
    parameters: int
    weight_dtype: str
    kv_dtype: str


class CapacityEngine(Schema):
    model: str | None = None
    dtype: str | None = Field(None, description="Precision of the weights.")
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    kv_capacity_tokens: int | None = Field(None, description="KV-cache capacity the engine reports, in tokens.")
    kv_block_size: int | None = None
    device: str | None = None
    planned_kv_capacity_tokens: int | None = Field(
        None,
        description="The planner's figure for the served model with the memory the engine gives its KV cache "
        "(`APPLIANCE_CPU_KV_CACHE_GIB` on a CPU; the GPU's share less the weights on a GPU), rounded down to "
        "whole KV blocks as the engine's is.",
    )


class CapacityOut(Schema):
    shape: CapacityShape
    device_memory_bytes: int
    memory_utilization: float
    context_tokens: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int = Field(description="What is left for the KV cache after the weights.")
    kv_capacity_tokens: int
    max_concurrent_requests: int = Field(description="Requests of `context_tokens` each that fit at once.")
    fits: bool = Field(description="False when not one request of `context_tokens` fits; `reason` says why.")
    reason: str
    gpus_per_engine: int = Field(description="GPUs each engine spreads the model over (tensor parallel).")
    engines: int = Field(description="Engines in the cluster; the figures above are per engine.")
    cluster_kv_capacity_tokens: int = Field(description="KV capacity of all the engines together.")
    cluster_max_concurrent_requests: int = Field(
        description="Requests of `context_tokens` all the engines hold at once."
    )
    engine: CapacityEngine | None = Field(description="What the running engine reports; null when it is down.")


@router.get(
    "/capacity", response=responses(ok={200: CapacityOut}), auth=auth.READ, tags=["engine"], summary="Capacity planner"
)
def capacity(
    request,
    layers: int | None = Query(None, ge=1, le=MAX_LAYERS, description="Transformer layers."),
    kv_heads: int | None = Query(None, ge=1, le=MAX_KV_HEADS, description="KV heads (`num_key_value_heads`)."),
    head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM, description="Head size."),
    parameters: float | None = Query(None, ge=1, le=MAX_PARAMETERS, description="Parameter count, e.g. 8.03e9."),
    weight_dtype: Dtype | None = Query(None, description="Weight precision; default: the model's."),  # noqa: B008
    kv_dtype: KvDtype | None = Query(None, description="KV-cache precision; default: the engine's."),  # noqa: B008
    memory_gib: float | None = Query(
        None, gt=0, le=MAX_MEMORY_GIB, description="Device memory; default: the engine's GPU, or this machine's memory."
    ),
    context_tokens: int | None = Query(
        None, ge=1, le=MAX_CONTEXT_TOKENS, description="Tokens per request; default: the configured context length."
    ),
    memory_utilization: float | None = Query(
        None, gt=0, le=1, description="Share of the device for weights and KV cache; default 0.9."
    ),
    gpus_per_engine: int | None = Query(
        None,
        ge=1,
        le=64,
        description="GPUs an engine spreads the model over; default: the configured tensor parallel size.",
    ),
    engines: int | None = Query(
        None, ge=1, le=10_000, description="Engines in the cluster; default: those the nodes report."
    ),
):
    """Weight memory, KV bytes per token, the KV budget and how many requests of a context length
    fit at once, for a model's shape on a device of some memory. `layers`, `kv_heads`, `head_dim`
    and `parameters` go together; without them, the served model. Beside it, what the running
    engine reports."""
    stats = console_selectors.engine()
    try:
        result = console_selectors.capacity_plan(
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            parameters=parameters,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            memory_bytes=int(memory_gib * GIB) if memory_gib is not None else None,
            context_tokens=context_tokens,
            memory_utilization=memory_utilization,
            gpus_per_engine=gpus_per_engine,
            engines=engines,
            engine_stats=stats,
        )
    except ShapeError as exc:
        errors = [{"field": name, "message": str(exc)} for name in exc.fields]
        raise ApiProblem(400, "bad-request", f"{', '.join(exc.fields)}: {exc}", errors=errors) from None
    return {**result.as_dict(), "engine": console_selectors.engine_capacity(stats)}
