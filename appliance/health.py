"""``GET /healthz``: the state of every part the appliance needs, as JSON.

200 when all are up, 503 when any is down, with a line per part saying what is wrong. The engine
is up only while its host answers with ``state: "ready"``: while the host starts its engine core
again it still answers, with ``restarting``, and the check is red at once rather than timing out.

The parts (the model, KV use, error texts) are for operators: staff signed in, or whoever
``/metrics`` answers (its bearer token, or this machine when no token is set). Anyone else is
told only ``{"status": "ok"}`` or ``{"status": "degraded"}``, with the same status code, which
is all a load balancer needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from appliance.database import direct_connection
from appliance.operators import may_see_operations
from inference.engine.client import EngineClient, EngineRequestError, EngineRestarting, EngineUnavailable
from inference.engine.protocol import EngineState, EngineStats

REQUIRED_QUEUES = ("ingest", "prefill", "decode")


# A database that takes longer than this to accept a connection is reported down (as long as a
# pooled request waits; a refused connection fails at once).
DATABASE_CHECK_TIMEOUT_S = 10


def check_database() -> dict:
    """Whether a new connection can be opened and pgvector is there. A connection of its own, not
    one from the pool, so that a database that is down is reported at once and why."""
    try:
        with direct_connection(DATABASE_CHECK_TIMEOUT_S) as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    except Exception as exc:
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}".strip()}
    if row is None:
        return {"ok": False, "detail": "the pgvector extension is not installed"}
    return {"ok": True, "vendor": connection.vendor, "pgvector": row[0]}


def check_broker() -> dict:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
        depths = {queue: int(client.llen(queue)) for queue in REQUIRED_QUEUES}
    except redis.RedisError as exc:
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()
    return {"ok": True, "queue_depths": depths}


# Asking the workers is a broadcast that waits WORKERS_REPLY_S for every reply, longer than a load
# balancer's probe may wait (Kubernetes gives one 1 s by default) and a message for every worker
# at each probe. So a green answer is kept: served for WORKERS_FRESH_S as it is, then served once
# more while the workers are asked again in the background, and never served older than
# WORKERS_STALE_S. A red answer is not kept: the workers are asked at each probe until they
# answer again, so that a recovery shows at once.
WORKERS_REPLY_S = 1.0
WORKERS_FRESH_S = 5.0
WORKERS_STALE_S = 30.0


class WorkersAnswer:
    """The last green answer of the workers of one broker, and whether it is being renewed."""

    def __init__(self, ask: Callable[[], dict], clock: Callable[[], float] = time.monotonic) -> None:
        self._ask = ask
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: tuple[str, float, dict] | None = None  # (broker URL, when, answer)
        self._renewing = False

    @property
    def renewing(self) -> bool:
        with self._lock:
            return self._renewing

    def get(self, broker_url: str) -> dict:
        with self._lock:
            kept = self._kept if self._kept is not None and self._kept[0] == broker_url else None
            age = self._clock() - kept[1] if kept is not None else WORKERS_STALE_S
            if kept is not None and age < WORKERS_STALE_S:
                if age >= WORKERS_FRESH_S and not self._renewing:
                    self._renewing = True
                    threading.Thread(
                        target=self._renew, args=(broker_url,), name="healthz-workers", daemon=True
                    ).start()
                return {**kept[2], "asked_s_ago": round(age, 1)}
        return self._renew(broker_url)

    def _renew(self, broker_url: str) -> dict:
        try:
            answer = self._ask()
        except Exception as exc:  # never leave the renewal marked as running
            answer = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        with self._lock:
            self._renewing = False
            self._kept = (broker_url, self._clock(), answer) if answer["ok"] else None
        return {**answer, "asked_s_ago": 0.0}


def check_workers(broker_ok: bool) -> dict:
    if not broker_ok:
        return {"ok": False, "detail": "cannot reach workers: the broker is down"}
    return _workers_answer.get(settings.CELERY_BROKER_URL)


def ask_workers() -> dict:
    """Which queues the workers that answer within WORKERS_REPLY_S consume."""
    from celery import Celery

    # A throw-away app bound to the broker the settings name now: the project's app caches its
    # producer pool, and kombu retries a publish to a vanished broker forever.
    probe = Celery("appliance-health", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    probe.conf.broker_transport_options = {"socket_connect_timeout": 2, "socket_timeout": 2}
    try:
        replies = probe.control.inspect(timeout=WORKERS_REPLY_S).active_queues() or {}
    except Exception as exc:
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        probe.close()
    served = {
        queue: sorted(name for name, queues in replies.items() if any(q["name"] == queue for q in queues))
        for queue in REQUIRED_QUEUES
    }
    missing = [queue for queue, workers in served.items() if not workers]
    result = {"ok": not missing, "queues": {queue: len(workers) for queue, workers in served.items()}}
    if missing:
        result["detail"] = f"no worker serves: {', '.join(missing)}"
    return result


_workers_answer = WorkersAnswer(lambda: ask_workers())  # looked up when called: a test may replace it


def check_engine() -> dict:
    client = EngineClient.from_settings()
    try:
        stats = client.stats(timeout_s=2.0)
    except EngineRestarting as exc:
        return {"ok": False, "state": EngineState.RESTARTING, "detail": f"the engine is restarting: {exc}"}
    except (EngineUnavailable, EngineRequestError, OSError) as exc:
        return _other_nodes_engines(client, str(exc))
    engine = EngineStats.from_message(stats)
    state = engine.state
    result: dict[str, Any] = {
        "ok": state == EngineState.READY,
        "state": state,
        "restarts": engine.restarts,  # engine-core restarts since the host started, if it counts them
        "model": engine.model,
        "kv_capacity_tokens": engine.kv_capacity_tokens,
        "max_model_len": engine.max_model_len,
        "running": engine.running,
        "waiting": engine.waiting,
        "kv_usage": engine.kv_usage,
    }
    if state == EngineState.RESTARTING:
        result["detail"] = "the engine is restarting: its engine core stopped and is being started again"
    elif state != EngineState.READY:
        result["detail"] = f"the engine is {state}, not ready"
    if "detail" in result and result["restarts"] is not None:
        result["detail"] += f" ({result['restarts']} restart(s) since its host started)"
    return result


def _other_nodes_engines(client: EngineClient, why: str) -> dict:
    """This node reaches no engine (a web node of a cluster has none of its own): the engine part
    is up when other nodes report engines that are ready, since their workers run the jobs this
    node queues. This node's own engine is never counted from its last report: it is the one that
    did not answer."""
    from appliance.cluster import nodes
    from inference.placement import engine_key

    here = engine_key(settings.APPLIANCE_NODE_NAME, str(client.address))
    try:
        listed = nodes()
    except redis.RedisError:
        listed = []
    ready = [
        f"{node['name']}"
        for node in listed
        if node["up"] and node["engine"].get("state") == EngineState.READY
        and engine_key(node["name"], node.get("engine_url") or "") != here
    ]  # fmt: skip
    if not ready:
        return {"ok": False, "detail": why}
    return {"ok": True, "state": EngineState.READY, "detail": f"no engine here ({why}); ready on: {', '.join(ready)}",
            "nodes_with_engine_ready": len(ready)}  # fmt: skip


@never_cache
@require_GET
def healthz(request):
    broker = check_broker()
    parts = {
        "database": check_database(),
        "broker": broker,
        "workers": check_workers(broker["ok"]),
        "engine": check_engine(),
    }
    ok = all(part["ok"] for part in parts.values())
    body: dict[str, Any] = {"status": "ok" if ok else "degraded"}
    if may_see_operations(request):
        body.update(parts)
        # Every node of the cluster, as each last announced itself. Shown, not counted in the
        # status: a load balancer asks whether *this* node serves, and another node's GPU being
        # down does not make it stop.
        body["nodes"] = check_nodes(broker["ok"])
    return JsonResponse(body, status=200 if ok else 503)


def check_nodes(broker_ok: bool) -> dict[str, Any]:
    from appliance.cluster import nodes

    if not broker_ok:
        return {"ok": False, "detail": "the broker is down: the nodes' reports cannot be read", "nodes": []}
    try:
        listed = nodes()
    except redis.RedisError as exc:
        return {"ok": False, "detail": f"the nodes' reports cannot be read: {exc}", "nodes": []}
    down = [node["name"] for node in listed if not node["up"]]
    result: dict[str, Any] = {"ok": not down, "nodes": listed}
    if down:
        result["detail"] = f"down: {', '.join(down)}"
    return result
