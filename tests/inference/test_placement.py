"""Placement's decisions (``inference.placement``), pure: which job a worker of an engine claims
from its turn, or whether it passes the turn on, given the other engines of the cluster."""

from __future__ import annotations

from inference.placement import (
    MAX_HOPS,
    Candidate,
    EngineView,
    choose,
    cluster_engines,
    engine_has_room,
    engine_key,
)

A, B, C = "gpu-a/unix:/run/engine.sock", "gpu-b/unix:/run/engine.sock", "tls://10.0.0.3:7000"


def engine(key: str, *, up: bool = True, room: bool = True) -> EngineView:
    return EngineView(key, up, room, frozenset({"prefill", "decode"}))


def decide(candidates, *, here=A, here_room=True, others=(), hops=0, wait_s=30.0):
    return choose(candidates, here=here, here_room=here_room, others=list(others), hops=hops, wait_s=wait_s)


def test_a_full_engine_passes_its_turn_while_another_has_room():
    jobs = [Candidate(1, 0.5)]
    assert decide(jobs, here_room=False, others=[engine(B)]).action == "pass"
    # ... but not when no other engine has room (the job queues in this host), nor for ever.
    assert decide(jobs, here_room=False, others=[engine(B, room=False)]).job_id == 1
    assert decide(jobs, here_room=False, others=[engine(B, up=False)]).job_id == 1
    assert decide(jobs, here_room=False, others=[engine(B)], hops=MAX_HOPS).job_id == 1


def test_a_job_is_left_to_the_engine_that_holds_its_document_and_the_next_one_is_taken():
    jobs = [Candidate(1, 2.0, affinity=B), Candidate(2, 1.0, affinity=None), Candidate(3, 0.5, affinity=A)]
    decision = decide(jobs, others=[engine(B)])
    assert decision.action == "claim" and decision.job_id == 2
    # The engine that holds it takes it first, whatever its place in the order.
    assert decide(jobs, here=B, others=[engine(A)]).job_id == 1


def test_a_job_stops_waiting_for_its_engine_when_that_engine_is_down_full_or_slow_to_come():
    for others in ([engine(B, up=False)], [engine(B, room=False)], []):
        assert decide([Candidate(1, 0.1, affinity=B)], others=others).job_id == 1
    assert decide([Candidate(1, 31.0, affinity=B)], others=[engine(B)]).job_id == 1
    assert decide([Candidate(1, 29.0, affinity=B)], others=[engine(B)]).action == "pass"
    assert decide([Candidate(1, 29.0, affinity=B)], others=[engine(B)], hops=MAX_HOPS).job_id == 1


def test_with_nothing_queued_the_turn_claims_nothing():
    decision = decide([], here_room=False, others=[engine(B)])
    assert decision.action == "claim" and decision.job_id is None


def test_room_is_read_from_what_an_engine_reports():
    assert engine_has_room(
        {"state": "ready", "waiting_for_admission": 0, "kv_budget_tokens": 100, "kv_reserved_tokens": 40}
    )
    assert not engine_has_room(
        {"state": "ready", "waiting_for_admission": 2, "kv_budget_tokens": 100, "kv_reserved_tokens": 40}
    )
    assert not engine_has_room(
        {"state": "ready", "waiting_for_admission": 0, "kv_budget_tokens": 100, "kv_reserved_tokens": 100}
    )
    assert not engine_has_room({"state": "restarting"})
    assert not engine_has_room({"url": "unix:/x", "error": "its engine does not answer"})


def test_the_cluster_view_lists_each_engine_with_the_queues_its_node_serves():
    nodes = [
        {"name": "web", "roles": ["web", "ingest"], "up": True, "engine_url": "", "engine": {}},
        {"name": "gpu-a", "roles": ["prefill", "decode", "engine"], "up": True, "engine_url": "unix:/run/engine.sock",
         "engine": {"state": "ready", "waiting_for_admission": 3}},
        {"name": "gpu-b", "roles": ["decode"], "up": False, "engine_url": "unix:/run/engine.sock",
         "engine": {"state": "ready"}},
        {"name": "gpu-c", "roles": ["prefill", "engine"], "up": True, "engine_url": "unix:/run/e0.sock",
         "engines": [{"url": "unix:/run/e0.sock", "state": "ready"}, {"url": "unix:/run/e1.sock", "error": "down"}]},
    ]  # fmt: skip
    views = {e.key: e for e in cluster_engines(nodes)}
    assert set(views) == {A, B, "gpu-c/unix:/run/e0.sock", "gpu-c/unix:/run/e1.sock"}
    assert views[A].up and not views[A].room  # requests wait for admission there
    assert not views[B].up and views[B].queues == {"decode"}
    assert views["gpu-c/unix:/run/e0.sock"].room and views["gpu-c/unix:/run/e0.sock"].queues == {"prefill"}
    assert not views["gpu-c/unix:/run/e1.sock"].up


def test_an_engine_reached_over_the_network_has_the_same_name_on_every_node():
    assert engine_key("gpu-a", C) == engine_key("web", C) == C
    assert engine_key("gpu-a", "unix:/run/engine.sock") != engine_key("gpu-b", "unix:/run/engine.sock")
