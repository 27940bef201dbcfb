"""Whether the broker can take a message now, asked before the web process writes a row that
only a message can make run.

A job row or an upload committed while the broker is down would wait for a message that never
comes, and the person would see a 500. So a write that must be followed by a message first asks
the broker, quickly (``broker_check``), and answers 503 with ``Retry-After`` when it does not
answer; a publish that fails after the commit undoes the row (``inference.services``,
``documents.services``). Publishing itself is bounded in the settings
(``CELERY_TASK_PUBLISH_RETRY_POLICY``, the transport's socket timeouts), so a dead broker costs a
request a few seconds at most, not kombu's default patience.

A broker can also lose what it holds: an external Redis without persistence that restarts, one
flushed or replaced, comes back empty, and every queued message is gone while the rows still say
they were sent; one that crashed loses what it wrote since its last snapshot, or in its last
second with an append-only file. The watchdogs leave a mark in the broker, the run id of the
server, and look at it at each round (``forgot``): when it is gone or names another run, every
queued row of theirs is marked unsent and sent again. A message too many is harmless, so a
restart that lost nothing (the embedded Valkey keeps its queues on disk) costs only that.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)

# A broker that is down refuses the connection at once; this bounds one that hangs. Not 1 s: on a
# 2-core box under a benchmark's load a live Valkey once took longer than that to answer a PING,
# and a person would have been told to come back for nothing.
CHECK_TIMEOUT_S = 3.0
RETRY_AFTER_S = 15  # the supervisor restarts an embedded broker within seconds

# What a publish raises when the broker is not there (kombu wraps the connection errors).
PUBLISH_ERRORS = (OperationalError, redis.RedisError, OSError)


def send_unsent(
    unsent: QuerySet,
    publish: Callable[..., Any],
    *,
    what: str,
    fields: tuple[str, ...] = (),
    limit: int = 500,
    take: dict[str, Any] | None = None,
    give_back: dict[str, Any] | None = None,
    why: str = "its message was never sent to its queue",
) -> int:
    """The watchdogs' send: publish the message of each row of ``unsent`` (rows filtered to those
    whose message is missing and that are past their grace period), ``publish(pk, *fields)``.
    Each row is taken first by writing ``take`` where ``unsent`` still holds it (compare-and-set;
    by default it records the send in ``dispatched_at``), so that two watchdogs never both send
    one; given back (``give_back``, by default ``dispatched_at`` cleared) if the broker refuses it,
    and then the sweep stops until its next round. Returns how many were sent."""
    now = timezone.now()
    take = take if take is not None else {"dispatched_at": now}
    give_back = give_back if give_back is not None else {"dispatched_at": None}
    sent = 0
    for pk, *values in unsent.order_by("pk").values_list("pk", *fields)[:limit]:
        if not unsent.filter(pk=pk).update(**take):
            continue
        try:
            publish(pk, *values)
        except PUBLISH_ERRORS:
            unsent.model.objects.filter(pk=pk, **take).update(**give_back)
            logger.warning("watchdog: the broker does not take messages; %s %s stays unsent", what, pk)
            return sent
        logger.warning("%s %s: %s; sent now", what, pk, why)
        sent += 1
    return sent


# The watchdogs' marks (``forgot``), one per kind of row they send: the run id of the broker
# they last looked at.
MARK_KEY = "appliance:broker-mark:{}"


def forgot(what: str) -> str | None:
    """Whether the broker may have lost messages since the watchdogs of ``what`` last looked:
    the mark they leave in it is gone (it came back empty: a Redis without persistence
    restarted, or one flushed) or names another run of the server (it restarted, and what it
    wrote in its last second, or since its last snapshot, may be gone; or a replica took over).
    Returns the broker's run id, for ``unsent_if_forgotten`` to leave as the mark once the rows
    are marked unsent, or None. A new broker, or the first
    look after an upgrade, counts as a loss too: sending the queued rows again is harmless (a
    message too many finds its job or document taken, and ends). "" for a broker that refuses
    INFO: then only an empty one is seen. Raises one of ``PUBLISH_ERRORS`` while the broker
    does not answer."""

    def look(client: redis.Redis) -> tuple[str, str | None]:
        try:
            run_id = str(client.info("server").get("run_id", ""))
        except redis.ResponseError:  # a managed Redis that renamed or refused INFO
            run_id = ""
        mark = client.get(MARK_KEY.format(what))
        return run_id, mark.decode() if isinstance(mark, bytes) else mark

    run_id, mark = _ask(look)
    return None if mark == run_id else run_id


def unsent_if_forgotten(what: str, mark_unsent: Callable[[], int]) -> int:
    """The watchdogs' look (``forgot``): if the broker may have lost the messages of ``what``,
    ``mark_unsent()`` (which returns how many rows it marked), then the mark is left, so that a
    failure in between leaves the loss to the next look. Returns how many were marked."""
    run_id = forgot(what)
    if run_id is None:
        return 0
    lost = mark_unsent()
    _ask(lambda client: client.set(MARK_KEY.format(what), run_id))
    if lost:
        logger.warning("the broker restarted or lost its data: %d %s sent again, in case their messages went with it",
                       lost, what)  # fmt: skip
    return lost


class BrokerUnavailable(ConnectionError):
    """The broker does not answer, so nothing can be queued: try again after ``retry_after_s``."""

    def __init__(self, message: str | None = None, *, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(
            message
            or "The appliance cannot queue work right now: its message broker does not answer. "
            f"Nothing was saved. Try again in about {retry_after_s} seconds."
        )
        self.retry_after_s = retry_after_s


def broker_check() -> None:
    """Raise ``BrokerUnavailable`` unless the broker answers a ping within ``CHECK_TIMEOUT_S``."""
    try:
        _ask(lambda client: client.ping())
    except redis.RedisError as exc:
        raise BrokerUnavailable() from exc


def _ask(command: Callable[[redis.Redis], Any]) -> Any:
    """``command`` on this process's client of the broker, once more if a pooled connection
    that a broker restart broke failed it (the pool has dropped it then)."""
    client = _client(settings.CELERY_BROKER_URL)
    try:
        return command(client)
    except redis.ConnectionError:
        return command(client)


@functools.lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    """One client (a pool of connections) per broker URL and process, not a connection per
    request; a connection broken by a broker restart is dropped by the pool and made again."""
    return redis.Redis.from_url(url, socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S)
