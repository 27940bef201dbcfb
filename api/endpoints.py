"""``/api/v1/usage``, ``/api/v1/engine`` and ``/api/v1/admin/usage``: what the caller used, what
the box runs, and (staff, admin scope) everyone's usage."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone
from ninja import Field, Query, Router, Schema

from api import auth
from api.models import ApiToken
from api.problems import responses
from inference.models import Job, RequestMetrics

router = Router()

ENGINE_FIELDS = (
    "model",
    "licence",
    "dtype",
    "kv_cache_dtype",
    "max_model_len",
    "kv_capacity_tokens",
    "kv_block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "running",
    "waiting",
    "kv_usage",
    "prefix_cache_hit_rate",
    "preemptions",
    "requests_served",
    "uptime_s",
    "scheduling",
    "vllm_version",
    "torch_version",
)


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
    vllm_version: str | None = None
    torch_version: str | None = None
    specsheet: dict | None = Field(
        None, description="The latest spec sheet `manage.py specsheet` measured on this box, if any."
    )


def _usage(jobs, metrics, group: str | None = None) -> list[dict] | dict:
    """Requests from jobs, tokens from their metrics; grouped by ``group`` (a Job field path)."""
    totals = {"requests": Count("pk")}
    tokens = {
        "engine_requests": Sum("engine_requests"),
        "prompt_tokens": Sum("prompt_tokens"),
        "output_tokens": Sum("output_tokens"),
    }
    if group is None:
        row = jobs.aggregate(**totals)
        row.update({k: v or 0 for k, v in metrics.aggregate(**tokens).items()})
        return row
    counted = {r[group]: r for r in jobs.values(group).annotate(**totals)}
    for r in metrics.values(f"job__{group}").annotate(**tokens):
        counted.setdefault(r[f"job__{group}"], {group: r[f"job__{group}"], "requests": 0}).update(
            {k: r[k] or 0 for k in tokens}
        )
    return [
        {"engine_requests": 0, "prompt_tokens": 0, "output_tokens": 0, **row}
        for row in sorted(counted.values(), key=lambda r: -r.get("output_tokens", 0))
    ]


def _by_token(jobs, metrics) -> list[dict]:
    rows = _usage(jobs, metrics, group="api_token")
    labels = {t.pk: str(t) for t in ApiToken.objects.filter(pk__in=[r["api_token"] for r in rows])}
    return [{**row, "token": labels.get(row.pop("api_token"))} for row in rows]


@router.get("/usage", response=responses(ok={200: CallerUsage}), auth=auth.READ, tags=["usage"], summary="Your usage")
def usage(request, days: int = Query(30, ge=1, le=366, description="How many days back.")):
    """What you asked of the appliance over the window: requests and tokens in and out, by kind
    and by token (the browser counts as no token)."""
    since = timezone.now() - timedelta(days=days)
    jobs = Job.objects.filter(owner=request.user, created_at__gte=since)
    metrics = RequestMetrics.objects.filter(job__owner=request.user, job__created_at__gte=since)
    return {
        "since": since,
        **_usage(jobs, metrics),
        "by_kind": _usage(jobs, metrics, group="kind"),
        "by_token": _by_token(jobs, metrics),
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
    jobs = Job.objects.filter(created_at__gte=since)
    metrics = RequestMetrics.objects.filter(job__created_at__gte=since)
    by_user = _usage(jobs, metrics, group="owner__username")
    return {
        "since": since,
        "by_user": [{**row, "user": row.pop("owner__username")} for row in by_user],
        "by_token": [row for row in _by_token(jobs, metrics) if row["token"] is not None],
    }


def latest_specsheet() -> dict | None:
    path = Path(settings.VAR_DIR) / "specsheet" / "latest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@router.get("/engine", response=responses(ok={200: EngineOut}), auth=auth.READ, tags=["engine"], summary="The engine")
def engine(request):
    """The model, its licence, the precision of weights and KV cache, the context length, the KV
    capacity and its live use, and the latest spec sheet: what a buyer asks, from the box itself."""
    from console.selectors import engine as engine_stats

    stats = engine_stats()
    out = {"up": stats is not None, "specsheet": latest_specsheet()}
    if stats:
        out.update({name: stats.get(name) for name in ENGINE_FIELDS})
    return out
