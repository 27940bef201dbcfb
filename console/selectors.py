"""Reads for the operations console: the engine, the queues, latency, throughput, failures and
usage, from the same sources as ``/metrics`` (the engine host, the broker, ``RequestMetrics``);
the capacity planner with this box's defaults; and the latest spec sheet."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone

from api.models import ApiToken
from appliance.sizing import machine_memory_bytes
from inference import selectors as job_selectors
from inference.capacity import (
    GIB,
    SHAPE_FIELDS,
    ModelShape,
    Plan,
    ShapeError,
    plan,
    plan_kv_cache,
    shape_of,
    shape_of_model_dir,
)
from inference.engine.protocol import EngineStats
from inference.models import Job, Queue

logger = logging.getLogger(__name__)

LATENCY_WINDOW = timedelta(hours=1)
USAGE_WINDOW = timedelta(days=30)
CHART_BUCKET = timedelta(minutes=5)
DEFAULT_MEMORY_UTILIZATION = 0.9
# What the engine reports that the capacity planner is compared with.
ENGINE_CAPACITY_FIELDS = (
    "model",
    "dtype",
    "kv_cache_dtype",
    "max_model_len",
    "kv_capacity_tokens",
    "kv_block_size",
    "device",
)
# The files `manage.py specsheet` writes next to latest.json, and nothing else, are served.
SPECSHEET_FILE_NAME = re.compile(r"specsheet-[0-9TZ]+(-ttft|-tokens-per-s)?\.(png|json|md)")


def engine() -> dict | None:
    """The engine host's own report (model, licence, precision, context, KV), or None when down."""
    from inference.engine.client import EngineClient, EngineRequestError, EngineUnavailable

    try:
        return EngineClient.from_settings().stats(timeout_s=2.0)
    except (EngineUnavailable, EngineRequestError, OSError):
        return None


def engine_capacity(stats: dict | None, check: dict | None = None) -> dict | None:
    """The part of the engine's report the capacity planner is compared with, and the planner's
    KV capacity for the served model in the same memory, in whole blocks (None: it is down).
    ``check``: ``served_model_check(stats)`` when the caller has it already."""
    if not stats:
        return None
    check = check or served_model_check(stats)
    engine = EngineStats.from_message(stats)
    return {
        **{name: getattr(engine, name) for name in ENGINE_CAPACITY_FIELDS},
        "planned_kv_capacity_tokens": check["planned_tokens_in_blocks"] if check else None,
    }


def engine_precisions(stats: dict) -> tuple[str | None, str | None]:
    """The weights' and the KV cache's precision the engine resolved, from its ``stats`` (on a
    CPU without bfloat16 arithmetic "auto" loads float32 weights, and the KV cache follows), not
    the configured ones; None for what it does not report."""
    engine = EngineStats.from_message(stats)
    return engine.dtype or None, engine.kv_cache_dtype or None


def served_model_shape(*, weight_dtype: str | None = None, kv_dtype: str | None = None, model_dir=None) -> ModelShape:
    """The served model's shape (``APPLIANCE_MODEL``, or ``model_dir``), in the precisions the
    engine is configured with unless others are given. ``ShapeError`` when it cannot be read."""
    model_dir = Path(model_dir or settings.APPLIANCE_MODEL)
    try:
        shape = shape_of_model_dir(
            model_dir,
            weight_dtype=weight_dtype or settings.APPLIANCE_DTYPE,
            kv_dtype=kv_dtype or settings.APPLIANCE_KV_CACHE_DTYPE,
        )
        _ = shape.weight_bytes, shape.kv_bytes_per_token  # an unknown dtype in its config fails here
    except Exception as exc:  # no config.json, a truncated safetensors header, a config of another kind...
        logger.warning("cannot read the shape of the model in %s: %s", model_dir, exc)
        raise ShapeError(
            f"the shape of the model {model_dir.name!r} could not be read ({type(exc).__name__}); "
            f"give {', '.join(SHAPE_FIELDS)}",
            SHAPE_FIELDS,
        ) from exc
    return shape


def capacity_plan(
    *,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    parameters: float | None = None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    memory_bytes: int | None = None,
    context_tokens: int | None = None,
    memory_utilization: float | None = None,
    gpus_per_engine: int | None = None,
    engines: int | None = None,
    model_dir=None,
    engine_stats: dict | None,
) -> Plan:
    """The capacity planner with this box's defaults for what is not given: the served model's
    shape (or ``model_dir``'s), the configured KV-cache precision, the device's memory (from
    ``engine_stats``, the engine's report the caller asked for once) and the configured context
    length; the topology this appliance runs (``APPLIANCE_TENSOR_PARALLEL_SIZE`` GPUs per engine,
    the engines the cluster view lists). ``ShapeError`` names the inputs to give or correct."""
    if engine_stats and not weight_dtype and layers is None:  # the served model: as the engine loaded it
        weight_dtype, engine_kv = engine_precisions(engine_stats)
        kv_dtype = kv_dtype or engine_kv
    kv_dtype = kv_dtype or settings.APPLIANCE_KV_CACHE_DTYPE
    shape = shape_of(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, parameters=parameters,
        weight_dtype=weight_dtype, kv_dtype=kv_dtype,
    )  # fmt: skip
    if shape is None:
        shape = served_model_shape(weight_dtype=weight_dtype, kv_dtype=kv_dtype, model_dir=model_dir)
    return plan(
        shape,
        device_memory_bytes=default_device_memory_bytes(engine_stats) if memory_bytes is None else memory_bytes,
        context_tokens=settings.APPLIANCE_MAX_MODEL_LEN if context_tokens is None else context_tokens,
        memory_utilization=DEFAULT_MEMORY_UTILIZATION if memory_utilization is None else memory_utilization,
        gpus_per_engine=settings.APPLIANCE_TENSOR_PARALLEL_SIZE if gpus_per_engine is None else gpus_per_engine,
        engines=cluster_engine_count() if engines is None else engines,
    )


def cluster_engine_count() -> int:
    """The engines of the cluster: those the nodes' reports list (up or down: a node down for a
    moment still counts in a plan), at least this node's ``APPLIANCE_ENGINES``."""
    from appliance.broker import PUBLISH_ERRORS
    from appliance.cluster import nodes
    from inference.placement import cluster_engines

    try:
        listed = {engine.key for engine in cluster_engines(nodes())}
    except PUBLISH_ERRORS:
        listed = set()
    return max(len(listed), settings.APPLIANCE_ENGINES)


def default_device_memory_bytes(stats: dict | None) -> int:
    """The device the planner assumes when none is given: the engine's GPU (``stats``, its
    report), or this machine's memory when the engine runs on the CPU (or does not answer)."""
    engine = EngineStats.from_message(stats or {})
    if engine.device == "cuda" and engine.device_memory_bytes:
        return int(engine.device_memory_bytes)
    return machine_memory_bytes()


def served_model_check(stats: dict | None) -> dict | None:
    """The planner's KV capacity for the served model with the memory the engine gives its KV
    cache, next to the capacity the engine reports, at the engine's context length. On a CPU that
    memory is ``APPLIANCE_CPU_KV_CACHE_GIB``; on a GPU it is ``APPLIANCE_GPU_MEMORY_UTILIZATION``
    of the device less the weights (vLLM also keeps room for activations, so the planner's figure
    is an upper bound there). The engine counts whole KV blocks, so the planner's tokens are
    rounded down to its block size too. None when the engine does not answer or the served
    model's shape cannot be read."""
    if not stats:
        return None
    try:
        weights, kv = engine_precisions(stats)
        shape = served_model_shape(weight_dtype=weights, kv_dtype=kv)
    except ShapeError:
        return None
    engine = EngineStats.from_message(stats)
    context = int(engine.max_model_len or settings.APPLIANCE_MAX_MODEL_LEN)
    if engine.device == "cuda" and engine.device_memory_bytes:
        # What the engine took (the operator's setting, or the planner's default it chose).
        utilization = float(engine.gpu_memory_utilization or settings.APPLIANCE_GPU_MEMORY_UTILIZATION or 0.9)
        planned = plan(
            shape,
            device_memory_bytes=int(engine.device_memory_bytes),
            context_tokens=context,
            memory_utilization=utilization,
        )
        memory = (
            f"APPLIANCE_GPU_MEMORY_UTILIZATION = {utilization:g} of the GPU's "
            f"{int(engine.device_memory_bytes) / GIB:.1f} GiB, less the weights"
        )
    else:
        planned = plan_kv_cache(shape, kv_cache_bytes=settings.APPLIANCE_CPU_KV_CACHE_GIB * GIB, context_tokens=context)
        memory = f"APPLIANCE_CPU_KV_CACHE_GIB = {settings.APPLIANCE_CPU_KV_CACHE_GIB} GiB"
    block = int(engine.kv_block_size or 0)
    in_blocks = planned.kv_capacity_tokens // block * block if block > 0 else planned.kv_capacity_tokens
    reported = engine.kv_capacity_tokens
    return {
        "plan": planned,
        "memory": memory,
        "kv_cache_bytes": planned.kv_budget_bytes,
        "kv_block_size": block or None,
        "planned_tokens": planned.kv_capacity_tokens,
        "planned_tokens_in_blocks": in_blocks,
        "engine_tokens": reported,
        "difference_tokens": int(reported) - in_blocks if reported is not None else None,
        # The engine is held to this many tokens whatever its memory holds (bench, a shared device).
        "capped_to_tokens": settings.APPLIANCE_KV_CAPACITY_TOKENS,
    }


def latest_specsheet() -> dict | None:
    """The latest spec sheet ``manage.py specsheet`` wrote (``var/specsheet/latest.json``), or None."""
    path = Path(settings.VAR_DIR) / "specsheet" / "latest.json"
    try:
        sheet = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return sheet if isinstance(sheet, dict) else None


def specsheet_file(name: str) -> Path | None:
    """A file of a spec sheet (its chart, JSON or Markdown) by its name, or None: only names of the
    form ``manage.py specsheet`` writes, only in its folder."""
    if not SPECSHEET_FILE_NAME.fullmatch(name):
        return None
    folder = (Path(settings.VAR_DIR) / "specsheet").resolve()
    path = (folder / name).resolve()
    if path.parent != folder or not path.is_file():
        return None
    return path


def cluster_nodes() -> list[dict] | None:
    """Every node as it last announced itself (``appliance.cluster``); None when the broker cannot
    be read."""
    import redis

    from appliance.cluster import nodes

    try:
        return nodes()
    except redis.RedisError:
        return None


def queues() -> list[dict]:
    """Per queue: tasks waiting in the broker, jobs queued and running, the cap, the oldest wait."""
    from appliance.health import check_broker

    broker = check_broker()
    depths = broker.get("queue_depths", {})
    now = timezone.now()
    caps = {
        "ingest": settings.APPLIANCE_INGEST_CONCURRENCY,
        Queue.PREFILL: settings.APPLIANCE_PREFILL_CONCURRENCY,
        Queue.DECODE: settings.APPLIANCE_DECODE_CONCURRENCY,
    }
    jobs: dict[str, dict[str, Any]] = {
        row["queue"]: dict(row)
        for row in Job.objects.values("queue").annotate(
            queued=Count("pk", filter=Q(state=Job.State.QUEUED)),
            running=Count("pk", filter=Q(state=Job.State.RUNNING)),
            oldest=Min("created_at", filter=Q(state=Job.State.QUEUED)),
        )
    }
    rows: list[dict[str, Any]] = []
    for name, cap in caps.items():
        row = jobs.get(str(name), {})
        oldest = row.get("oldest")
        rows.append(
            {
                "name": str(name),
                "broker_depth": depths.get(str(name)),
                "cap": cap,
                "queued": row.get("queued", 0),
                "running": row.get("running", 0),
                "oldest_wait_s": (now - oldest).total_seconds() if oldest else None,
            }
        )
    return rows


def latency(since=None) -> list[dict]:
    """Per queue over the window: requests, TTFT p50/p95 and ITL p50/p95 (ms). ITL p50 is the
    median of each request's mean gap, ITL p95 the p95 of each request's own p95."""
    since = since or timezone.now() - LATENCY_WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, count(*), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms), "
            "percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY itl_mean_ms), "
            "percentile_cont(0.95) WITHIN GROUP (ORDER BY itl_p95_ms), "
            "coalesce(sum(output_tokens), 0), coalesce(sum(prompt_tokens), 0), avg(decode_tokens_per_s) "
            "FROM inference_requestmetrics WHERE created_at >= %s GROUP BY queue ORDER BY queue",
            [since],
        )
        rows = cursor.fetchall()
    window_s = max(1.0, (timezone.now() - since).total_seconds())
    keys = ("queue", "requests", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "output_tokens", "prompt_tokens")
    result = []
    for row in rows:
        entry = dict(zip(keys, row[:8], strict=True))
        entry["decode_tokens_per_s"] = row[8]
        entry["output_tokens_per_s"] = entry["output_tokens"] / window_s  # over the whole window
        entry["requests_per_hour"] = entry["requests"] * 3600 / window_s
        result.append(entry)
    return result


def latency_series(since=None) -> dict[str, list[tuple[float, float, float]]]:
    """Per queue, per 5-minute bucket: (minutes ago, TTFT p50, TTFT p95) in ms, oldest first."""
    since = since or timezone.now() - LATENCY_WINDOW
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, date_bin(%s, created_at, %s) AS bucket, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms), "
            "percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms) "
            "FROM inference_requestmetrics WHERE created_at >= %s GROUP BY queue, bucket ORDER BY queue, bucket",
            [CHART_BUCKET, since, since],  # type: ignore[list-item]  # psycopg sends a timedelta as an interval
        )
        rows = cursor.fetchall()
    series: dict[str, list[tuple[float, float, float]]] = {}
    for queue, bucket, p50, p95 in rows:
        series.setdefault(queue, []).append(((now - bucket).total_seconds() / 60, p50, p95))
    return series


def failures(limit: int = 20):
    return (
        Job.objects.filter(state=Job.State.FAILED).select_related("owner", "document").order_by("-finished_at")[:limit]
    )


def failure_reasons(since=None) -> list[dict[str, Any]]:
    """Failed jobs in the window grouped by their reason, most frequent first."""
    since = since or timezone.now() - timedelta(days=1)
    return [
        dict(row)
        for row in Job.objects.filter(state=Job.State.FAILED, finished_at__gte=since)
        .values("error")
        .annotate(n=Count("pk"))
        .order_by("-n")[:10]
    ]


def usage_per_user(since=None) -> list[dict]:
    """Per user over the window: jobs asked for, engine requests, tokens in and out (the meaning
    of ``inference.selectors.usage``, which the API's usage shares)."""
    since = since or timezone.now() - USAGE_WINDOW
    rows = job_selectors.usage(since=since, group="owner__username")
    return [{"user": row.pop("owner__username"), **row} for row in rows]


def usage_per_token(since=None) -> list[dict]:
    """Per API token over the window: its name, prefix and owner, jobs asked for with it, engine
    requests, tokens in and out. Jobs started without a token (the web UI) are not counted."""
    since = since or timezone.now() - USAGE_WINDOW
    rows = [row for row in job_selectors.usage(since=since, group="api_token") if row["api_token"] is not None]
    chosen = ApiToken.objects.filter(pk__in=[row["api_token"] for row in rows]).select_related("user")
    tokens = {token.pk: token for token in chosen}
    out = []
    for row in rows:
        token = tokens[row.pop("api_token")]
        out.append(
            {"token_id": token.pk, "name": token.name, "prefix": token.prefix, "username": token.user.username, **row}
        )
    return out


def chart(series: dict[str, list[tuple[float, float, float]]], *, width: int = 640, height: int = 180) -> dict:
    """SVG polylines of TTFT p50 and p95 per queue against minutes ago (numbers only: safe to
    put in a template as they are)."""
    values = [v for points in series.values() for _, p50, p95 in points for v in (p50, p95) if v is not None]
    top = max(values, default=1.0) * 1.1 or 1.0
    span = LATENCY_WINDOW.total_seconds() / 60

    def xy(minutes_ago: float, value: float) -> str:
        x = width * (1 - min(minutes_ago, span) / span)
        y = height - height * (value / top)
        return f"{x:.1f},{y:.1f}"

    lines = []
    for queue, points in sorted(series.items()):
        for name, index in (("p50", 1), ("p95", 2)):
            coords = " ".join(xy(p[0], p[index]) for p in points if p[index] is not None)
            lines.append({"queue": queue, "name": name, "points": coords, "last": points[-1][index]})
    return {"width": width, "height": height, "top_ms": top, "lines": lines}
