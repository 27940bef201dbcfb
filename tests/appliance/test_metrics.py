"""GET /metrics: Prometheus text with queue depths, per-queue latency histograms, token counters
and the engine host's gauges."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from inference.models import Job, JobKind, Queue, RequestMetrics

pytestmark = pytest.mark.django_db


def _scrape(client=None, **headers) -> dict[str, list]:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(response.content.decode())}


def _sample(families, name, **labels):
    family_name = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum").removesuffix("_total")
    for sample in families[family_name]:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def _request_metrics(owner, *, queue: Queue, ttft_ms: float, itl_ms: float, preemptions: int = 0) -> None:
    job = Job.objects.create(owner=owner, kind=JobKind.CHAT, queue=queue, state=Job.State.SUCCEEDED)
    RequestMetrics.objects.create(
        job=job, queue=queue, queue_wait_ms=10, admission_wait_ms=0, ttft_ms=ttft_ms, itl_mean_ms=itl_ms,
        itl_p95_ms=itl_ms * 2, prompt_tokens=100, output_tokens=50, kv_reservation_tokens=150, preemptions=preemptions,
    )  # fmt: skip


def test_latency_histograms_and_token_counters_per_queue(alice):
    _request_metrics(alice, queue=Queue.DECODE, ttft_ms=80, itl_ms=30)
    _request_metrics(alice, queue=Queue.DECODE, ttft_ms=400, itl_ms=40, preemptions=1)
    _request_metrics(alice, queue=Queue.PREFILL, ttft_ms=4000, itl_ms=60)
    families = _scrape()
    ttft = "appliance_request_ttft_seconds_bucket"
    assert _sample(families, ttft, queue="decode", le="0.1") == 1
    assert _sample(families, ttft, queue="decode", le="0.5") == 2
    assert _sample(families, ttft, queue="decode", le="+Inf") == 2
    assert _sample(families, ttft, queue="prefill", le="2.0") == 0
    assert _sample(families, ttft, queue="prefill", le="5.0") == 1
    assert _sample(families, "appliance_request_ttft_seconds_sum", queue="decode") == pytest.approx(0.48)
    assert _sample(families, "appliance_request_itl_seconds_bucket", queue="decode", le="0.05") == 2
    assert _sample(families, "appliance_output_tokens_total", queue="decode") == 100
    assert _sample(families, "appliance_preempted_requests_total", queue="decode") == 1
    assert _sample(families, "appliance_jobs", queue="decode", state="succeeded") == 2
    assert _sample(families, "appliance_broker_up") == 1
    assert {"ingest", "prefill", "decode"} <= {s.labels["queue"] for s in families["appliance_queue_depth"]}


@pytest.mark.integration
def test_the_engine_hosts_gauges_are_exported(engine_host):
    families = _scrape()
    assert _sample(families, "appliance_engine_up") == 1
    capacity = engine_host.stats()["kv_capacity_tokens"]
    assert _sample(families, "appliance_engine_kv_capacity_tokens") == capacity
    for name in (
        "appliance_engine_running_requests",
        "appliance_engine_waiting_requests",
        "appliance_engine_kv_cache_usage_ratio",
        "appliance_engine_prefix_cache_hit_ratio",
        "appliance_engine_preemptions",
    ):
        assert name in families
    info = families["appliance_engine_info"][0]
    assert info.labels["model"] == "SmolLM2-135M-Instruct" and info.labels["scheduling"] == "appliance"


def test_an_engine_that_does_not_answer_is_reported_not_an_error(settings, tmp_path):
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "nobody.sock"
    families = _scrape()
    assert _sample(families, "appliance_engine_up") == 0


def test_the_engine_state_is_a_gauge_per_state(fake_engine):
    fake_engine.stats.update(state="restarting", restarts=2)
    families = _scrape()
    assert _sample(families, "appliance_engine_up") == 1  # the host answers, its engine core does not
    assert _sample(families, "appliance_engine_state", state="restarting") == 1
    assert _sample(families, "appliance_engine_state", state="ready") == 0
    assert _sample(families, "appliance_engine_restarts_total") == 2

    fake_engine.stats["state"] = "ready"
    families = _scrape()
    assert _sample(families, "appliance_engine_state", state="ready") == 1
    assert _sample(families, "appliance_engine_state", state="restarting") == 0


def test_an_engine_host_that_does_not_count_restarts_exports_no_restart_counter(fake_engine):
    fake_engine.stats.pop("restarts", None)
    families = _scrape()
    assert "appliance_engine_restarts" not in families
    assert _sample(families, "appliance_engine_state", state="ready") == 1


def test_a_database_that_is_down_is_reported_not_an_error(monkeypatch):
    from django.db import OperationalError, connection

    assert _sample(_scrape(), "appliance_database_up") == 1

    def refused(*args, **kwargs):
        raise OperationalError("connection refused (as if the database were down)")

    monkeypatch.setattr(connection, "cursor", refused)
    families = _scrape()
    assert _sample(families, "appliance_database_up") == 0
    assert "appliance_jobs" not in families and "appliance_request_ttft_seconds" not in families
    assert "appliance_broker_up" in families and "appliance_engine_up" in families  # the rest is still there


def test_a_configured_token_is_required():
    with override_settings(APPLIANCE_METRICS_TOKEN="s3cret-scrape-token"):
        client = Client()
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        _scrape(client, Authorization="Bearer s3cret-scrape-token")


def test_without_a_token_only_a_scraper_on_this_machine_is_answered():
    with override_settings(APPLIANCE_METRICS_TOKEN=None):
        assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
        assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
        refused = Client(REMOTE_ADDR="192.0.2.10").get("/metrics")
        assert refused.status_code == 401 and "only on this machine" in refused.content.decode()


def test_a_request_a_proxy_on_the_box_forwarded_is_not_the_box_itself(settings):
    from django.test import Client

    settings.APPLIANCE_METRICS_TOKEN = ""
    client = Client()  # REMOTE_ADDR 127.0.0.1, as behind a TLS proxy on this machine
    assert client.get("/metrics").status_code == 200
    for header in ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"):
        assert client.get("/metrics", **{header: "203.0.113.9"}).status_code == 401
        assert set(client.get("/healthz", **{header: "203.0.113.9"}).json()) == {"status"}


def test_every_engine_gauge_reads_a_declared_field():
    from appliance.metrics import ENGINE_GAUGES
    from inference.engine.protocol import EngineStats

    assert set(ENGINE_GAUGES) <= set(EngineStats.field_names())
