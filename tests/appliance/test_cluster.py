"""One view of the cluster: nodes announce themselves in the real broker; /healthz, /metrics,
the console and `manage.py nodes` list every node, and a node that stops reporting is down."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from appliance.cluster import NODES_KEY, Announcer, NodeReport, announce, node_view, nodes
from inference.streaming import sync_client

pytestmark = pytest.mark.django_db

ENGINE = {"state": "ready", "model": "SmolLM2-135M-Instruct", "kv_capacity_tokens": 24576, "kv_usage": 0.25,
          "running": 3, "waiting": 1}  # fmt: skip


def test_a_node_is_down_once_its_last_report_is_older_than_the_limit():
    report = NodeReport(name="gpu-1", roles=["engine", "prefill"], engine_url="unix:/x", announced_at=1000.0,
                        engine=ENGINE)  # fmt: skip
    assert NodeReport.from_json(report.to_json()) == report
    fresh = node_view(report, now=1010.0, down_after_s=20)
    assert fresh["up"] and fresh["age_s"] == 10 and "detail" not in fresh
    assert fresh["engine"]["model"] == "SmolLM2-135M-Instruct" and fresh["engine"]["device"] is None
    stale = node_view(report, now=1030.5, down_after_s=20)
    assert not stale["up"] and stale["detail"] == "no report for 30 s (down after 20 s)"


@pytest.fixture
def two_nodes(settings):
    """gpu-1 reported a second ago, gpu-2 a minute ago (it stopped reporting)."""
    settings.APPLIANCE_NODE_DOWN_AFTER_S = 20
    client = sync_client()
    client.delete(NODES_KEY)
    now = time.time()
    announce(NodeReport(name="gpu-1", roles=["engine", "prefill", "decode"], engine_url="unix:/srv/engine.sock",
                        announced_at=now - 1, engine=ENGINE))  # fmt: skip
    announce(NodeReport(name="gpu-2", roles=["engine", "prefill", "decode"], engine_url="tls://gpu-2:8470",
                        announced_at=now - 60, engine={**ENGINE, "kv_usage": 0.9}))  # fmt: skip
    yield
    client.delete(NODES_KEY)


def test_every_node_is_listed_and_the_silent_one_is_down(two_nodes):
    listed = {node["name"]: node for node in nodes()}
    assert set(listed) == {"gpu-1", "gpu-2"}
    assert listed["gpu-1"]["up"] and not listed["gpu-2"]["up"]
    assert listed["gpu-2"]["engine_url"] == "tls://gpu-2:8470"


def test_healthz_lists_the_nodes_without_another_nodes_death_failing_this_one(two_nodes, settings):
    body = Client().get("/healthz").json()
    part = body["nodes"]
    assert part["ok"] is False and part["detail"] == "down: gpu-2"
    assert [(n["name"], n["up"]) for n in part["nodes"]] == [("gpu-1", True), ("gpu-2", False)]
    sync_client().hdel(NODES_KEY, "gpu-2")
    again = Client().get("/healthz")
    assert again.json()["nodes"]["ok"] is True
    # The status code is about this node's own parts: the same with another node down or not.
    status_without = again.status_code
    test_node = NodeReport(name="gpu-2", roles=["engine"], engine_url="", announced_at=time.time() - 600)
    announce(test_node)
    assert Client().get("/healthz").status_code == status_without


def test_metrics_have_a_node_label(two_nodes):
    response = Client().get("/metrics")
    families = {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}
    up = {s.labels["node"]: s.value for s in families["appliance_node_up"]}
    assert up == {"gpu-1": 1.0, "gpu-2": 0.0}
    kv = {s.labels["node"]: s.value for s in families["appliance_node_engine_kv_cache_usage_ratio"]}
    assert kv == {"gpu-1": 0.25}  # a node that is down has no current figures
    age = {s.labels["node"]: s.value for s in families["appliance_node_report_age_seconds"]}
    assert age["gpu-2"] >= 60


def test_the_console_shows_each_node_with_its_engine(two_nodes, django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("ops", password="pw-ops-long-enough", is_staff=True))
    page = client.get("/console/").content.decode()
    section = page[page.index('id="console-nodes"') :]
    section = section[: section.index("</section>")]
    assert "gpu-1" in section and "gpu-2" in section
    assert '<strong class="warn">down</strong>' in section and "no report for" in section
    assert "SmolLM2-135M-Instruct" in section and "25 %" in section and "3 / 1" in section


def test_manage_py_nodes_lists_and_forgets(two_nodes, capsys):
    call_command("nodes")
    out = capsys.readouterr().out
    assert "gpu-1: up" in out and "gpu-2: DOWN" in out
    call_command("nodes", forget="gpu-2")
    assert [n["name"] for n in nodes()] == ["gpu-1"]
    with pytest.raises(CommandError, match="no node named 'gpu-9'"):
        call_command("nodes", forget="gpu-9")


@pytest.mark.integration
def test_a_serving_node_announces_itself_with_what_its_engine_reports(engine_host, settings):
    settings.APPLIANCE_NODE_NAME = "this-node"
    client = sync_client()
    client.hdel(NODES_KEY, "this-node")
    announcer = Announcer(["engine", "prefill", "decode"], interval_s=0.5)
    announcer.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            node = next((n for n in nodes() if n["name"] == "this-node"), None)
            if node and node["engine"]["model"]:
                break
            time.sleep(0.2)
        assert node is not None and node["up"]
        assert node["engine"]["model"] == engine_host.stats()["model"]
        assert node["engine"]["kv_capacity_tokens"] > 0 and node["roles"] == ["engine", "prefill", "decode"]
        first = node["announced_at"]
        time.sleep(1.2)
        assert next(n for n in nodes() if n["name"] == "this-node")["announced_at"] > first  # it keeps reporting
    finally:
        announcer.stop()
        client.hdel(NODES_KEY, "this-node")


def test_a_node_with_two_engines_reports_each(settings, tmp_path):
    from appliance.cluster import this_node_report

    settings.APPLIANCE_ENGINES = 2
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "engine.sock"  # nothing listens: each says why
    report = this_node_report(["engine", "prefill", "decode"])
    assert [e["url"] for e in report.engines] == [
        f"unix:{tmp_path / 'engine.sock'}",
        f"unix:{tmp_path / 'engine-1.sock'}",
    ]
    assert all("its engine does not answer" in e["error"] for e in report.engines)
    assert report.engine_url == report.engines[0]["url"] and report.engine_error
