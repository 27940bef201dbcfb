"""``GET /metrics``: Prometheus metrics of the whole appliance, gathered when scraped.

Workers store one ``RequestMetrics`` row per request and the engine host keeps its own gauges, so
the web process has nothing to count in memory: each scrape reads queue depths from the broker,
per-queue latency histograms and token counters from the database (cumulative over all stored
rows, so they only grow, as Prometheus counters must), and the engine's gauges from the engine
host. A part that is down is reported by its ``*_up`` gauge, not by a failed scrape: with the
database down, the families read from it are left out and ``appliance_database_up`` is 0. The
engine's state (``ready``, or ``restarting`` while its host starts the engine core again) is the
``appliance_engine_state`` gauge, one series per state with 1 for the current one.

When ``APPLIANCE_METRICS_TOKEN`` is set, scrapes must send it as a bearer token.
"""

from __future__ import annotations

import redis
from django.db import DatabaseError, connection
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from appliance.health import REQUIRED_QUEUES, check_broker, check_database
from appliance.operators import scraper_authorised
from inference.engine.client import EngineClient, EngineRequestError, EngineRestarting, EngineUnavailable
from inference.engine.protocol import EngineState, EngineStats
from inference.models import Job, Queue

# Seconds. From a drafter's first token (tens of ms) to a long document's (minutes on a CPU).
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
QUEUE_WAIT_BUCKETS_S = (0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)

ENGINE_GAUGES = {
    "running": ("appliance_engine_running_requests", "Requests the engine is running"),
    "waiting": ("appliance_engine_waiting_requests", "Requests waiting inside the engine"),
    "kv_usage": ("appliance_engine_kv_cache_usage_ratio", "Share of the KV cache in use"),
    "prefix_cache_hit_rate": ("appliance_engine_prefix_cache_hit_ratio", "Prefix-cache hits / queries since start"),
    "kv_capacity_tokens": ("appliance_engine_kv_capacity_tokens", "KV cache capacity vLLM reports, in tokens"),
    "kv_budget_tokens": ("appliance_engine_kv_budget_tokens", "KV tokens admission may reserve"),
    "kv_reserved_tokens": ("appliance_engine_kv_reserved_tokens", "KV tokens reserved by requests in the engine"),
    "waiting_for_admission": ("appliance_engine_admission_waiting_requests", "Requests waiting for KV blocks"),
    "drafting_requests": ("appliance_engine_drafting_requests", "Drafting requests in the engine"),
    "documents_held": (
        "appliance_engine_documents_held_requests",
        "Document requests held back this step for drafting (their prefill, or their decode beside drafters)",
    ),
    "document_budget_tokens": (
        "appliance_engine_document_budget_tokens",
        "Document prefill tokens a step may hold beside drafting",
    ),
    "document_share": (
        "appliance_engine_document_share_ratio",
        "Share of the engine's time spent reading documents' prompts lately, while they wait for prefill",
    ),
    "target_step_ms": ("appliance_engine_target_step_milliseconds", "Step duration the drafting ITL target allows"),
    "max_model_len": ("appliance_engine_max_model_len_tokens", "Context length configured"),
}


def _histogram_rows(field: str, buckets_ms: list[float]) -> dict[str, tuple[list[int], int, float]]:
    """Per queue: cumulative counts for each bucket, total count, and sum, in one query."""
    filters = ", ".join(f"count(*) FILTER (WHERE {field} <= %s)" for _ in buckets_ms)
    sql = (
        f"SELECT queue, {filters}, count({field}), coalesce(sum({field}), 0) "  # noqa: S608 - field names are ours
        f"FROM inference_requestmetrics WHERE {field} IS NOT NULL GROUP BY queue"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, buckets_ms)
        rows = cursor.fetchall()
    n = len(buckets_ms)
    return {row[0]: (list(row[1 : n + 1]), int(row[n + 1]), float(row[n + 2])) for row in rows}


def _histogram(name: str, documentation: str, field: str, buckets_s: tuple[float, ...]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=["queue"])
    rows = _histogram_rows(field, [b * 1000 for b in buckets_s])
    for queue in Queue.values:
        counts, total, sum_ms = rows.get(queue, ([0] * len(buckets_s), 0, 0.0))
        family.add_metric(
            [queue],
            [(str(b), c) for b, c in zip(buckets_s, counts, strict=True)] + [("+Inf", total)],
            sum_ms / 1000,
        )
    return family


class ApplianceCollector:
    def collect(self):
        broker = check_broker()
        yield GaugeMetricFamily("appliance_broker_up", "1 when the broker answers", value=int(broker["ok"]))
        depth = GaugeMetricFamily("appliance_queue_depth", "Tasks waiting in the broker, per queue", labels=["queue"])
        for queue in REQUIRED_QUEUES:
            depth.add_metric([queue], broker.get("queue_depths", {}).get(queue, 0))
        yield depth

        try:  # asked first on a connection of its own, so that a scrape does not wait out the pool
            database = list(_database_families()) if check_database()["ok"] else []
        except DatabaseError:
            database = []
        yield GaugeMetricFamily("appliance_database_up", "1 when the database answers", value=int(bool(database)))
        yield from database
        yield from _engine_metrics()
        if broker["ok"]:
            yield from _node_families()


# Per node, from each node's last report in the broker (appliance.cluster).
NODE_ENGINE_GAUGES = {
    "kv_usage": ("appliance_node_engine_kv_cache_usage_ratio", "Share of the node's engine's KV cache in use"),
    "kv_capacity_tokens": ("appliance_node_engine_kv_capacity_tokens", "KV cache capacity of the node's engine"),
    "running": ("appliance_node_engine_running_requests", "Requests the node's engine is running"),
    "waiting": ("appliance_node_engine_waiting_requests", "Requests waiting inside the node's engine"),
}


def _node_families():
    from appliance.cluster import nodes

    try:
        listed = nodes()
    except redis.RedisError:
        return
    up = GaugeMetricFamily("appliance_node_up", "1 while the node reports (manage.py serve)", labels=["node"])
    age = GaugeMetricFamily("appliance_node_report_age_seconds", "Age of the node's last report", labels=["node"])
    engine = {key: GaugeMetricFamily(name, doc, labels=["node"]) for key, (name, doc) in NODE_ENGINE_GAUGES.items()}
    for node in listed:
        up.add_metric([node["name"]], int(node["up"]))
        age.add_metric([node["name"]], node["age_s"])
        if node["up"]:
            for key, family in engine.items():
                value = node["engine"].get(key)
                if value is not None:
                    family.add_metric([node["name"]], float(value))
    yield up
    yield age
    yield from engine.values()


def _database_families():
    """What is read from the database: job counts, sources, per-queue latency histograms, token
    counters."""
    jobs = GaugeMetricFamily("appliance_jobs", "Jobs per queue and state", labels=["queue", "state"])
    counts = {(row["queue"], row["state"]): row["n"] for row in _job_counts()}
    for queue in Queue.values:
        for state in Job.State.values:
            jobs.add_metric([queue, state], counts.get((queue, state), 0))
    yield jobs

    yield from _source_families()
    yield _histogram("appliance_request_ttft_seconds", "Time to first token, per queue", "ttft_ms", TTFT_BUCKETS_S)
    yield _histogram(
        "appliance_request_itl_seconds",
        "Mean inter-token latency of each request, per queue",
        "itl_mean_ms",
        ITL_BUCKETS_S,
    )
    yield _histogram(
        "appliance_request_itl_p95_seconds",
        "p95 inter-token latency of each request, per queue",
        "itl_p95_ms",
        ITL_BUCKETS_S,
    )
    yield _histogram(
        "appliance_request_queue_wait_seconds",
        "Job created -> a worker started it, per queue",
        "queue_wait_ms",
        QUEUE_WAIT_BUCKETS_S,
    )
    yield from _token_counters()


def _source_families():
    """Each enabled source (watched folder, mailbox): whether its last poll failed, and when one
    last succeeded, so that an alert can say that a mailbox has not been read for a day."""
    from documents.selectors import enabled_sources

    labels = ["source", "kind"]
    failing = GaugeMetricFamily("appliance_source_failing", "1 when the source's last poll failed", labels=labels)
    success = GaugeMetricFamily(
        "appliance_source_last_success_timestamp_seconds", "When the source's last poll succeeded", labels=labels
    )
    for source in enabled_sources():
        failing.add_metric([source.name, source.kind], int(bool(source.last_error)))
        if source.last_success_at is not None:
            success.add_metric([source.name, source.kind], source.last_success_at.timestamp())
    yield failing
    yield success


def _job_counts():
    from django.db.models import Count

    return Job.objects.values("queue", "state").annotate(n=Count("pk")).order_by()


def _token_counters():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, coalesce(sum(prompt_tokens), 0), coalesce(sum(output_tokens), 0), "
            "coalesce(sum(cached_prompt_tokens), 0), count(*), count(*) FILTER (WHERE preemptions > 0) "
            "FROM inference_requestmetrics GROUP BY queue"
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    names = [
        ("appliance_prompt_tokens", "Prompt tokens of finished requests"),
        ("appliance_output_tokens", "Output tokens of finished requests"),
        ("appliance_cached_prompt_tokens", "Prompt tokens found in the prefix cache"),
        ("appliance_requests", "Finished requests"),
        ("appliance_preempted_requests", "Finished requests the engine preempted at least once"),
    ]
    for index, (name, documentation) in enumerate(names):
        family = CounterMetricFamily(name, documentation, labels=["queue"])
        for queue in Queue.values:
            family.add_metric([queue], rows.get(queue, (0,) * len(names))[index])
        yield family


def _engine_state(state: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "appliance_engine_state", "1 for the state the engine host reports (ready, restarting)", labels=["state"]
    )
    for each in dict.fromkeys((EngineState.READY, EngineState.RESTARTING, state)):
        family.add_metric([each], int(each == state))
    return family


def _engine_up(value: int) -> GaugeMetricFamily:
    return GaugeMetricFamily("appliance_engine_up", "1 when the engine host answers", value=value)


def _engine_metrics():
    try:
        stats = EngineClient.from_settings().stats(timeout_s=2.0)
    except EngineRestarting:
        yield _engine_up(1)
        yield _engine_state(EngineState.RESTARTING)
        return
    except (EngineUnavailable, EngineRequestError, OSError):
        yield _engine_up(0)
        return
    engine = EngineStats.from_message(stats)
    yield _engine_up(1)
    yield _engine_state(engine.state)
    if engine.restarts is not None:
        yield CounterMetricFamily(
            "appliance_engine_restarts",
            "Engine-core restarts since the engine host started",
            value=engine.restarts,
        )
    info = GaugeMetricFamily(
        "appliance_engine_info",
        "The engine's model and precision",
        labels=["model", "dtype", "kv_cache_dtype", "scheduling", "device"],
    )
    info.add_metric(
        [
            "" if value is None else str(value)
            for value in (engine.model, engine.dtype, engine.kv_cache_dtype, engine.scheduling, engine.device_name)
        ],
        1,
    )
    yield info
    for key, (name, documentation) in ENGINE_GAUGES.items():
        value = getattr(engine, key)
        if value is not None:  # some are known only while drafting runs
            yield GaugeMetricFamily(name, documentation, value=float(value))
    yield CounterMetricFamily(
        "appliance_engine_preemptions", "Preemptions since the engine started", value=engine.preemptions or 0
    )
    yield CounterMetricFamily(
        "appliance_engine_requests_served",
        "Requests the engine finished since it started",
        value=engine.requests_served or 0,
    )


@never_cache
@require_GET
def metrics(request):
    if not scraper_authorised(request):
        response = HttpResponse(
            "A bearer token is required (APPLIANCE_METRICS_TOKEN); without one set, /metrics answers only "
            "on this machine.\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ApplianceCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
