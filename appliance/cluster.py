"""One view of the cluster: every node announces itself in the broker, and every web node reads
the same list.

``manage.py serve`` announces its node every ``APPLIANCE_NODE_HEARTBEAT_S`` (a thread beside the
supervisor's loop): its name (``APPLIANCE_NODE_NAME``, the host name by default), its roles, the
engine its workers use and what that engine reports (model, KV capacity and use, running and
waiting). The reports sit in one broker hash, ``appliance:nodes``, so a node that stops
reporting is still listed: once its last report is older than ``APPLIANCE_NODE_DOWN_AFTER_S``
it is shown *down* (jobs it held are handed on by the job watchdog, as for any worker that
stops). ``/healthz``, ``/metrics`` (a ``node`` label) and the console's overview read
``nodes()``. A node taken out for good is forgotten with ``manage.py nodes --forget NAME``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

NODES_KEY = "appliance:nodes"

# What a node's report keeps of its engine's stats (``EngineStats``).
ENGINE_FIELDS = ("state", "model", "kv_capacity_tokens", "kv_usage", "running", "waiting", "max_model_len",
                 "device", "device_count", "restarts",
                 "kv_budget_tokens", "kv_reserved_tokens", "waiting_for_admission")  # placement's  # fmt: skip


@dataclass(frozen=True)
class NodeReport:
    name: str
    roles: list[str]
    engine_url: str  # the engine this node's workers use ("" for a node without workers or engine)
    announced_at: float  # seconds since the epoch
    pid: int = 0
    engine: dict[str, Any] = field(default_factory=dict)  # ENGINE_FIELDS of its (first) engine's stats
    engine_error: str = ""  # why its engine did not answer
    # A node with several engines (APPLIANCE_ENGINES): each one's URL and ENGINE_FIELDS, or its error.
    engines: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeReport:
        values = json.loads(text)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})


def node_view(report: NodeReport, *, now: float, down_after_s: float) -> dict[str, Any]:
    """A report as the views show it: ``up`` while it is recent, its age, and why it is down."""
    age = max(0.0, now - report.announced_at)
    up = age <= down_after_s
    view: dict[str, Any] = {**asdict(report), "up": up, "age_s": round(age, 1)}
    view["engine"] = {key: report.engine.get(key) for key in ENGINE_FIELDS}  # every field, None if unknown
    if not up:
        view["detail"] = f"no report for {age:.0f} s (down after {down_after_s:.0f} s)"
    elif report.engine_error:
        view["detail"] = report.engine_error
    return view


def nodes(client: Any = None, *, now: float | None = None) -> list[dict[str, Any]]:
    """Every node that has announced itself, by name, up or down (``node_view``)."""
    client = client or _client()
    now = time.time() if now is None else now
    reports = []
    for name, text in sorted(client.hgetall(NODES_KEY).items()):
        try:
            reports.append(NodeReport.from_json(text))
        except (ValueError, TypeError):
            logger.warning("an unreadable node report under %r is skipped", name)
    return [node_view(r, now=now, down_after_s=settings.APPLIANCE_NODE_DOWN_AFTER_S) for r in reports]


def forget(name: str, client: Any = None) -> bool:
    return bool((client or _client()).hdel(NODES_KEY, name))


def _client() -> Any:
    from inference.streaming import sync_client

    return sync_client()


def _engine_report(client: Any) -> dict[str, Any]:
    try:
        stats = client.stats(timeout_s=2.0)
    except Exception as exc:  # noqa: BLE001 - a report says why its engine is not answering
        return {"url": str(client.address), "error": f"its engine does not answer: {exc}"}
    return {"url": str(client.address), **{k: stats.get(k) for k in ENGINE_FIELDS}}


def this_node_report(roles: list[str]) -> NodeReport:
    """This node's report now: for a node with engines or workers, what each engine it uses reports."""
    from appliance.supervisor import engine_slots
    from inference.engine.client import EngineClient

    engines: list[dict[str, Any]] = []
    if "engine" in roles:  # its own engine hosts, at their sockets (the first at APPLIANCE_ENGINE_SOCKET)
        for slot in engine_slots(settings):
            socket = slot.get("APPLIANCE_ENGINE_SOCKET", settings.APPLIANCE_ENGINE_SOCKET)
            engines.append(_engine_report(EngineClient(socket)))
    elif {"prefill", "decode"} & set(roles):
        engines.append(_engine_report(EngineClient.from_settings()))
    head = engines[0] if engines else {}
    return NodeReport(
        name=settings.APPLIANCE_NODE_NAME, roles=list(roles), engine_url=head.get("url", ""),
        announced_at=time.time(), pid=os.getpid(), engine={k: head.get(k) for k in ENGINE_FIELDS} if head else {},
        engine_error=head.get("error", ""), engines=engines if len(engines) > 1 else [],
    )  # fmt: skip


def announce(report: NodeReport, client: Any = None) -> None:
    (client or _client()).hset(NODES_KEY, report.name, report.to_json())


class Announcer:
    """Announces this node every ``interval_s`` from a thread of its own, so that a broker or an
    engine that does not answer never holds up the supervisor's loop."""

    def __init__(self, roles: list[str], *, interval_s: float | None = None) -> None:
        self.roles = roles
        self.interval_s = settings.APPLIANCE_NODE_HEARTBEAT_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-announcer", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                announce(this_node_report(self.roles))
                if self._failing:
                    logger.info("node %s is announced again", settings.APPLIANCE_NODE_NAME)
                self._failing = False
            except Exception as exc:  # noqa: BLE001 - the broker may be restarting; the next beat retries
                if not self._failing:
                    logger.warning("node %s could not be announced: %s", settings.APPLIANCE_NODE_NAME, exc)
                self._failing = True
            self._stop.wait(self.interval_s)
