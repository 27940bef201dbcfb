"""The order in which the jobs waiting in one queue are started: users take turns (pure).

Without it a queue is a line in arrival order, and one person's batch of 100 summaries holds
another person's single summary behind all of them. With it, the next job a free worker takes
is that of the owner with the fewest jobs running in the queue, ties to the owner served least
recently (never served first), then that owner's oldest job. A batch then costs anyone else at
most one job's turn.

``services.job_claim_next`` takes the first job of this order in SQL (one row, locked);
``claim_order`` plays the whole order forward for the place and ETA shown to a waiting job. The
two share the rule written here, and the tests hold them to the same answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Waiting:
    """A queued job as the order sees it."""

    job_id: object
    owner_id: int
    created_at: datetime


def claim_order(waiting: list[Waiting], *, running: dict[int, int], last_served: dict[int, datetime]) -> list[object]:
    """Job ids in the order workers would start them, if none of the running jobs finished
    meanwhile: each start counts as one more running job of its owner and serves them now.

    ``running``: jobs running in the queue per owner; ``last_served``: when each owner's latest
    job in the queue was started (an owner missing from it has never been served)."""
    queues: dict[int, list[Waiting]] = defaultdict(list)
    for job in sorted(waiting, key=lambda j: (j.created_at, str(j.job_id))):
        queues[job.owner_id].append(job)
    load = {owner: running.get(owner, 0) for owner in queues}
    # Served "now" in the simulation is later than any real time; a counter keeps the turns in
    # order. Never served sorts first, then the earliest real time, then the simulated turns.
    served: dict[int, tuple[int, float]] = {
        owner: (1, last_served[owner].timestamp()) if owner in last_served else (0, 0.0) for owner in queues
    }
    heads = {owner: 0 for owner in queues}
    order: list[object] = []
    turn = 0
    while len(order) < len(waiting):
        owner = min(
            (o for o in queues if heads[o] < len(queues[o])),
            key=lambda o: (load[o], served[o], queues[o][heads[o]].created_at, str(queues[o][heads[o]].job_id)),
        )
        order.append(queues[owner][heads[owner]].job_id)
        heads[owner] += 1
        load[owner] += 1
        turn += 1
        served[owner] = (2, float(turn))
    return order
