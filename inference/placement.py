"""Placement of jobs on the cluster's engines: which worker claims which job.

A ``run_job`` message is a turn of its queue (``lifecycle``); any worker of any node that
consumes the queue may take it. With one engine that is all there is to it. With several (several
nodes, or several engines on one node), two things matter that Celery cannot see:

- **Room.** Each engine host admits requests by its own KV cache. A worker whose engine is full
  would claim a job and leave it queued inside that host while another engine idles. So a worker
  whose engine has no room passes its turn on (publishes it again) while some other engine of the
  queue has room; when none has, it claims as before and the job queues politely in its host.
- **Prefix cache.** A document's second job (clauses after its summary) reads the same prompt,
  which the engine that ran the first job still holds in its prefix cache. The engine that last
  ran a job of a document is remembered (``AFFINITY_PREFIX`` keys in the broker, for
  ``APPLIANCE_PLACEMENT_AFFINITY_TTL_S``); a worker of another engine leaves such a job to that
  engine while that engine is up and has room, for at most ``APPLIANCE_PLACEMENT_WAIT_S`` of
  the job's waiting, and takes the next job in fair-share order instead.

A turn is passed to one engine: every inference worker also consumes a queue of its engine's own
(``direct_queue``), and the turn goes there, so that the engine it is meant for is the one that
takes it; a turn of the whole queue follows ``APPLIANCE_PLACEMENT_WAIT_S`` later and is claimed
wherever it is taken, in case that engine's node stopped since it last reported. A turn is
passed on at most ``MAX_HOPS`` times; then it is claimed wherever it is, so that a turn never
circles for ever (a node whose report is stale, an engine that reports room it no longer has). This module decides (pure); ``lifecycle`` reads what it decides on: this engine's stats,
the cluster view every node announces (``appliance.cluster``, a few seconds old at most) and
the remembered engines of the candidates' documents.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

AFFINITY_PREFIX = "appliance:document-engine:"
CANDIDATES = 32  # queued jobs, in fair-share order, that a turn may choose among
MAX_HOPS = 6
# The queues each role's workers consume (a node's roles say which it serves).
ROLE_QUEUES = {"prefill": "prefill", "decode": "decode"}


def engine_key(node: str, url: str) -> str:
    """An engine's name in the cluster: a TCP or TLS URL names it anywhere; a Unix socket only on
    its node."""
    return url if not url.startswith("unix:") else f"{node}/{url}"


def direct_queue(celery_queue: str, engine: str) -> str:
    """The queue of ``celery_queue``'s turns passed to the workers of ``engine`` alone."""
    return f"{celery_queue}.{hashlib.sha256(engine.encode()).hexdigest()[:16]}"


def engine_has_room(stats: Mapping[str, Any]) -> bool:
    """Whether an engine (its stats, or a node report's fields of them) would admit a request now:
    ready, nothing waiting for admission, and some of its KV budget not reserved."""
    if stats.get("state") not in (None, "ready") or stats.get("error"):
        return False
    if (stats.get("waiting_for_admission") or 0) > 0:
        return False
    budget, reserved = stats.get("kv_budget_tokens"), stats.get("kv_reserved_tokens")
    if budget is None or reserved is None:  # an engine that does not say: taken as having room
        return True
    return bool(reserved < budget)


@dataclass(frozen=True)
class EngineView:
    key: str
    up: bool
    room: bool
    queues: frozenset[str]


def cluster_engines(nodes: Iterable[Mapping[str, Any]]) -> list[EngineView]:
    """The engines the cluster view (``appliance.cluster.nodes()``) lists, each with the queues
    of the node whose workers use it. A node with workers lists the engine they use; one with
    several engines lists each."""
    engines: list[EngineView] = []
    for node in nodes:
        queues = frozenset(ROLE_QUEUES[r] for r in node.get("roles", ()) if r in ROLE_QUEUES)
        if not queues:
            continue
        reports = node.get("engines") or [{"url": node.get("engine_url", ""), **(node.get("engine") or {})}]
        for report in reports:
            if not report.get("url"):
                continue
            up = bool(node.get("up")) and not node.get("engine_error") and not report.get("error")
            engines.append(EngineView(engine_key(node.get("name", ""), report["url"]), up, up and engine_has_room(report),
                                      queues))  # fmt: skip
    return engines


@dataclass(frozen=True)
class Candidate:
    """A queued job that may start now, as placement sees it."""

    job_id: Any
    waited_s: float  # since it was queued
    affinity: str | None = None  # the engine that last ran a job of its document


@dataclass(frozen=True)
class Decision:
    action: Literal["claim", "pass"]
    job_id: Any = None
    reason: str = ""
    to: str = ""  # the engine a passed turn goes to


def choose(candidates: Sequence[Candidate], *, here: str, here_room: bool, others: Sequence[EngineView],
           hops: int, wait_s: float) -> Decision:  # fmt: skip
    """What a worker of engine ``here`` does with its turn, given the queue's candidates in
    fair-share order and the other engines of the queue (``others``)."""
    if not candidates:
        return Decision("claim", None, "nothing to claim")
    roomy = [e.key for e in others if e.up and e.room and e.key != here]
    last_hop = hops >= MAX_HOPS
    if not here_room and roomy and not last_hop:
        first = candidates[0].affinity  # the next job's own engine, if it is among them
        return Decision(
            "pass", reason="this engine is full and another has room", to=first if first in roomy else roomy[0]
        )
    for candidate in candidates:
        if candidate.affinity is None or candidate.affinity == here:
            return Decision("claim", candidate.job_id, "no other engine holds its document")
        if candidate.affinity not in roomy:
            return Decision("claim", candidate.job_id, "the engine that holds its document is down or full")
        if candidate.waited_s >= wait_s:
            return Decision("claim", candidate.job_id, "it waited long enough for the engine that holds its document")
    if last_hop:
        return Decision("claim", candidates[0].job_id, "its turn was passed on too often")
    return Decision("pass", reason="the next job waits for the engine that holds its document",
                    to=str(candidates[0].affinity))  # fmt: skip
