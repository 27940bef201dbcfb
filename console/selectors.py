"""Reads for the operations console: the engine, the queues, latency, throughput, failures and
usage, from the same sources as ``/metrics`` (the engine host, the broker, ``RequestMetrics``)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone

from inference.models import Job, Queue, RequestMetrics

LATENCY_WINDOW = timedelta(hours=1)
USAGE_WINDOW = timedelta(days=30)
CHART_BUCKET = timedelta(minutes=5)


def engine() -> dict | None:
    """The engine host's own report (model, licence, precision, context, KV), or None when down."""
    from inference.engine.client import EngineClient, EngineRequestError, EngineUnavailable

    try:
        return EngineClient.from_settings().stats(timeout_s=2.0)
    except (EngineUnavailable, EngineRequestError, OSError):
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
    jobs = {
        row["queue"]: row
        for row in Job.objects.values("queue").annotate(
            queued=Count("pk", filter=Q(state=Job.State.QUEUED)),
            running=Count("pk", filter=Q(state=Job.State.RUNNING)),
            oldest=Min("created_at", filter=Q(state=Job.State.QUEUED)),
        )
    }
    rows = []
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
            [CHART_BUCKET, since, since],
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


def failure_reasons(since=None) -> list[dict]:
    """Failed jobs in the window grouped by their reason, most frequent first."""
    since = since or timezone.now() - timedelta(days=1)
    return list(
        Job.objects.filter(state=Job.State.FAILED, finished_at__gte=since)
        .values("error")
        .annotate(n=Count("pk"))
        .order_by("-n")[:10]
    )


def usage_per_user(since=None) -> list[dict]:
    """Per user over the window: jobs, engine requests, tokens in and out."""
    since = since or timezone.now() - USAGE_WINDOW
    return list(
        RequestMetrics.objects.filter(created_at__gte=since)
        .values("job__owner__username")
        .annotate(
            jobs=Count("pk"),
            engine_requests=Sum("engine_requests"),
            prompt_tokens=Sum("prompt_tokens"),
            output_tokens=Sum("output_tokens"),
        )
        .order_by("-output_tokens")
    )


def usage_per_token(since=None) -> list[dict]:
    """Per API token over the window: its name, prefix and owner, jobs, engine requests, tokens in
    and out. Jobs started without a token (the web UI) are not counted."""
    since = since or timezone.now() - USAGE_WINDOW
    return list(
        RequestMetrics.objects.filter(created_at__gte=since, job__api_token__isnull=False)
        .values(
            token_id=F("job__api_token"),
            name=F("job__api_token__name"),
            prefix=F("job__api_token__prefix"),
            username=F("job__api_token__user__username"),
        )
        .annotate(
            jobs=Count("pk"),
            engine_requests=Sum("engine_requests"),
            prompt_tokens=Sum("prompt_tokens"),
            output_tokens=Sum("output_tokens"),
        )
        .order_by("-output_tokens", "token_id")
    )


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
