"""inference/fairshare.py: the order in which a queue's waiting jobs start (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from inference.fairshare import Waiting, claim_order

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _jobs(owner: int, count: int, *, start_s: int = 0, prefix: str | None = None) -> list[Waiting]:
    prefix = prefix or f"u{owner}"
    return [Waiting(f"{prefix}-{i}", owner, T0 + timedelta(seconds=start_s + i)) for i in range(count)]


def test_one_persons_batch_does_not_hold_anothers_single_job_behind_it():
    batch = _jobs(1, 100)
    single = _jobs(2, 1, start_s=200)  # queued after the whole batch
    order = claim_order(batch + single, running={1: 2}, last_served={1: T0})
    assert order.index("u2-0") == 0  # user 1 already has two running, user 2 none
    order = claim_order(batch + single, running={}, last_served={})
    assert order.index("u2-0") == 1  # nobody running: the oldest job first, then it is user 2's turn


def test_ties_go_to_the_owner_served_least_recently_then_never_served_first():
    a, b, c = _jobs(1, 1), _jobs(2, 1, start_s=10), _jobs(3, 1, start_s=20)
    served = {1: T0 + timedelta(minutes=5), 2: T0 + timedelta(minutes=1)}
    assert claim_order(a + b + c, running={}, last_served=served) == ["u3-0", "u2-0", "u1-0"]


def test_each_owner_gets_their_own_jobs_oldest_first_and_owners_take_turns():
    order = claim_order(_jobs(1, 3) + _jobs(2, 2, start_s=100), running={}, last_served={})
    assert order == ["u1-0", "u2-0", "u1-1", "u2-1", "u1-2"]


def test_an_owner_with_more_jobs_running_waits_until_the_others_catch_up():
    order = claim_order(_jobs(1, 2) + _jobs(2, 3, start_s=100), running={1: 2}, last_served={})
    assert order == ["u2-0", "u2-1", "u1-0", "u2-2", "u1-1"]


def test_every_waiting_job_appears_once():
    waiting = _jobs(1, 7) + _jobs(2, 3, start_s=3) + _jobs(3, 5, start_s=1)
    order = claim_order(waiting, running={3: 1}, last_served={2: T0})
    assert sorted(order) == sorted(j.job_id for j in waiting)
