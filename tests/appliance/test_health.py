"""/healthz against real services: a broker that stops is reported down, with a 503."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import Client

from appliance import health
from appliance.credentials import EmbeddedCredentials
from appliance.embedded import EmbeddedValkey, free_port
from appliance.health import WORKERS_FRESH_S, WORKERS_STALE_S, WorkersAnswer, ask_workers

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_broker(tmp_path, settings):
    """A real Valkey of this test's own, so that stopping it disturbs nothing else."""
    valkey = EmbeddedValkey(
        data_dir=tmp_path / "valkey", port=free_port(), credentials=EmbeddedCredentials.of(tmp_path)
    )
    valkey.start()
    settings.CELERY_BROKER_URL = valkey.url
    yield valkey
    valkey.stop()


def test_healthz_reports_a_stopped_broker_as_down(own_broker):
    client = Client()
    before = client.get("/healthz").json()
    assert before["broker"]["ok"] is True
    assert before["database"]["ok"] is True and before["database"]["pgvector"]

    own_broker.stop()
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "degraded"
    assert body["broker"]["ok"] is False and body["broker"]["detail"]
    assert body["workers"]["ok"] is False  # nobody can reach the workers without a broker
    assert body["database"]["ok"] is True  # the other parts are still reported truthfully


def test_healthz_reports_a_missing_engine_host(settings, tmp_path):
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "nothing-listens-here.sock"
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["engine"]["ok"] is False
    assert "not answering" in response.json()["engine"]["detail"]


def test_a_node_without_an_engine_is_up_while_another_nodes_engine_is_ready(settings, tmp_path, monkeypatch):
    """A web node of a cluster reaches no engine of its own; the engines of the GPU nodes serve."""
    settings.APPLIANCE_NODE_NAME = "web-node"
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "nothing-listens-here.sock"
    gpu = {"name": "gpu-1", "up": True, "engine_url": "tls://10.0.0.5:7000", "engine": {"state": "ready"}}
    itself = {"name": "web-node", "up": True, "engine_url": f"unix:{tmp_path / 'nothing-listens-here.sock'}",
              "engine": {"state": "ready"}}  # its own last report: not counted  # fmt: skip
    monkeypatch.setattr("appliance.cluster.nodes", lambda: [itself, gpu])
    engine = Client().get("/healthz").json()["engine"]
    assert engine["ok"] is True and "ready on: gpu-1" in engine["detail"] and "not answering" in engine["detail"]
    gpu["up"] = False  # the GPU node stopped reporting: nothing can run the jobs
    engine = Client().get("/healthz").json()["engine"]
    assert engine["ok"] is False and "not answering" in engine["detail"]


@pytest.fixture
def workers_up(monkeypatch):
    """The workers part answered as up: no worker pools run in these unit tests, and the engine's
    part is the one under test."""
    monkeypatch.setattr(
        "appliance.health.check_workers",
        lambda broker_ok: {"ok": True, "queues": {"ingest": 1, "prefill": 1, "decode": 1}},
    )


def test_healthz_is_red_while_the_engine_restarts_and_green_once_it_is_ready(fake_engine, workers_up):
    client = Client()
    fake_engine.stats.update(state="ready", restarts=0)
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["engine"] == {
        "ok": True,
        "state": "ready",
        "restarts": 0,
        "model": "fake-model",
        "kv_capacity_tokens": 4096,
        "max_model_len": 2048,
        "running": 0,
        "waiting": 0,
        "kv_usage": 0.0,
    }

    fake_engine.stats.update(state="restarting", restarts=1)
    response = client.get("/healthz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "degraded"
    assert body["engine"]["ok"] is False
    assert body["engine"]["state"] == "restarting"
    assert "restarting" in body["engine"]["detail"] and "1 restart(s)" in body["engine"]["detail"]
    assert body["engine"]["restarts"] == 1
    assert body["engine"]["model"] == "fake-model"  # what the host still knows is shown
    assert body["database"]["ok"] is True and body["broker"]["ok"] is True  # only the engine is red

    fake_engine.stats.update(state="ready")
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["engine"]["ok"] is True and "detail" not in response.json()["engine"]


def test_an_engine_host_that_reports_no_state_is_ready_when_it_answers(fake_engine, workers_up):
    del fake_engine.stats["state"]  # a host from before the state field
    response = Client().get("/healthz")
    assert response.status_code == 200
    engine = response.json()["engine"]
    assert engine["ok"] is True and engine["state"] == "ready"
    assert engine["restarts"] is None  # not counted by that host: shown as unknown, not as 0


def test_an_engine_in_a_state_other_than_ready_is_red(fake_engine, workers_up):
    fake_engine.stats["state"] = "loading"
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["engine"]["ok"] is False
    assert response.json()["engine"]["detail"] == "the engine is loading, not ready"


def test_an_engine_restarting_error_to_stats_is_red_and_says_restarting(fake_engine, workers_up):
    fake_engine.error = {"code": "engine_restarting", "detail": "the engine core is starting", "in_flight": False}
    response = Client().get("/healthz")
    assert response.status_code == 503
    engine = response.json()["engine"]
    assert engine["ok"] is False and engine["state"] == "restarting"
    assert "the engine core is starting" in engine["detail"]


def test_callers_from_the_network_are_told_only_up_or_down(fake_engine, workers_up, settings, django_user_model):
    fake_engine.stats.update(state="ready", restarts=0)
    remote = Client(REMOTE_ADDR="192.0.2.1")
    response = remote.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}  # no model, no KV use
    fake_engine.stats.update(state="restarting", restarts=1)
    response = remote.get("/healthz")
    assert response.status_code == 503 and response.json() == {"status": "degraded"}  # no error texts

    staff = django_user_model.objects.create_user("operator", password="a long password indeed", is_staff=True)
    remote.force_login(staff)
    assert remote.get("/healthz").json()["engine"]["state"] == "restarting"  # staff see the parts

    settings.APPLIANCE_METRICS_TOKEN = "s3cret-scrape-token"
    on_the_box = Client()  # loopback, but a token is set: it must be brought
    assert on_the_box.get("/healthz").json() == {"status": "degraded"}
    scraper = on_the_box.get("/healthz", headers={"Authorization": "Bearer s3cret-scrape-token"}).json()
    assert scraper["engine"]["model"] == "fake-model"


class FakeWorkers:
    """A fake of the broadcast to the workers: answers what it is told, and counts the asks."""

    def __init__(self) -> None:
        self.answer: dict = {"ok": True, "queues": {"ingest": 1, "prefill": 1, "decode": 1}}
        self.asked = 0
        self.asked_event = threading.Event()

    def __call__(self) -> dict:
        self.asked += 1
        self.asked_event.set()
        return dict(self.answer)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _renewed(answer: WorkersAnswer, workers: FakeWorkers) -> None:
    assert workers.asked_event.wait(5), "the background renewal never asked the workers"
    deadline = time.monotonic() + 5
    while answer.renewing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not answer.renewing


def test_a_green_workers_answer_is_kept_then_renewed_in_the_background_then_asked_again_when_stale():
    workers, clock = FakeWorkers(), FakeClock()
    answer = WorkersAnswer(workers, clock=clock)
    assert answer.get("redis://a")["ok"] is True and workers.asked == 1  # nothing kept: asked at once
    clock.now += WORKERS_FRESH_S - 0.1
    kept = answer.get("redis://a")
    assert workers.asked == 1 and kept["ok"] is True and kept["asked_s_ago"] == pytest.approx(WORKERS_FRESH_S - 0.1)
    workers.asked_event.clear()
    clock.now += 0.2  # past fresh: served as kept, renewed behind the answer
    assert answer.get("redis://a")["ok"] is True
    _renewed(answer, workers)
    assert workers.asked == 2
    assert answer.get("redis://a")["asked_s_ago"] == 0.0  # the renewal's answer is the one kept now
    clock.now += WORKERS_STALE_S + 1  # too old to serve: the probe waits for the workers
    workers.answer = {
        "ok": False,
        "queues": {"ingest": 1, "prefill": 0, "decode": 1},
        "detail": "no worker serves: prefill",
    }
    assert answer.get("redis://a")["ok"] is False and workers.asked == 3


def test_a_red_workers_answer_is_not_kept_and_another_broker_is_asked_for_itself():
    workers, clock = FakeWorkers(), FakeClock()
    answer = WorkersAnswer(workers, clock=clock)
    workers.answer = {"ok": False, "detail": "no worker serves: decode"}
    assert answer.get("redis://a")["ok"] is False
    workers.answer = {"ok": True, "queues": {"ingest": 1, "prefill": 1, "decode": 1}}
    assert answer.get("redis://a")["ok"] is True and workers.asked == 2  # a recovery shows at the next probe
    assert answer.get("redis://b")["ok"] is True and workers.asked == 3  # kept for broker a only


def test_a_broadcast_that_raises_is_red_and_does_not_stop_later_renewals():
    clock = FakeClock()
    calls = []

    def failing() -> dict:
        calls.append(1)
        raise OSError("the broker went away")

    answer = WorkersAnswer(failing, clock=clock)
    assert answer.get("redis://a") == {"ok": False, "detail": "OSError: the broker went away", "asked_s_ago": 0.0}
    assert answer.get("redis://a")["ok"] is False and len(calls) == 2


def test_healthz_asks_the_real_workers_once_for_probes_close_together(workers, monkeypatch):
    """Two probes a moment apart: the second is answered from the first's broadcast to the real
    workers, and says how old that answer is."""
    asked = []

    def counted() -> dict:
        asked.append(1)
        return ask_workers()

    monkeypatch.setattr(health, "_workers_answer", WorkersAnswer(counted))
    first = Client().get("/healthz", REMOTE_ADDR="127.0.0.1").json()
    second = Client().get("/healthz", REMOTE_ADDR="127.0.0.1").json()
    assert first["workers"]["ok"] is True, first["workers"]
    assert second["workers"]["queues"] == first["workers"]["queues"]
    assert len(asked) == 1
    assert first["workers"]["asked_s_ago"] == 0.0 and second["workers"]["asked_s_ago"] < WORKERS_FRESH_S
