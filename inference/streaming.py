"""Token deltas from the worker to the browser, through the broker.

Each job has a Redis stream (``job:<id>:events``). The worker appends ``delta`` events as text
arrives and one final event (``done``, ``failed`` or ``cancelled``). A browser reads it as
server-sent events whose ids are the stream ids, so a browser that reconnects sends
``Last-Event-ID`` and resumes exactly after what it already has. A stream is used rather than
plain pub/sub because pub/sub forgets what was said before a subscriber arrived.

Only the attempt that holds the job writes to its stream. A worker's events are *fenced*: a
short script in the broker appends an event only while the job's fence key holds that worker's
attempt number (``Job.attempts``), set when the attempt claims the job and removed when the job
is handed on, requeued or finished elsewhere. A first attempt that was only slow, not dead,
finds its events refused and stops: its text never reaches a browser. The services' own events
(cancelled, a failure the watchdog decides, waiting for a worker) are not fenced; ``waiting``
goes out only while no attempt holds the job.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

FINAL_EVENTS = frozenset({"done", "failed", "cancelled"})
STREAM_MAXLEN = 200_000


def stream_key(job_id: Any) -> str:
    return f"job:{job_id}:events"


def cancel_key(job_id: Any) -> str:
    return f"job:{job_id}:cancel"


def fence_key(job_id: Any) -> str:
    return f"job:{job_id}:fence"


# KEYS: stream, fence, cancel. ARGV: attempt ("" = only while no attempt holds the job), event,
# data, maxlen, ttl. Returns {1, id, cancelled} when appended, {0, "", cancelled} when fenced out.
_FENCED_XADD = """
local fence = redis.call('GET', KEYS[2])
if (ARGV[1] == '' and fence) or (ARGV[1] ~= '' and fence ~= ARGV[1]) then
  return {0, '', redis.call('EXISTS', KEYS[3])}
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'event', ARGV[2], 'data', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {1, id, redis.call('EXISTS', KEYS[3])}
"""

# KEYS: a key. ARGV: a value. Deletes the key only while it holds that value: clearing an old
# attempt's fence never clears the fence of a newer attempt that claimed the job since, and a
# turn that outlived its time is not taken from whoever holds it now.
_DELETE_IF_HOLDS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Outcome(enum.Enum):
    SENT = "sent"
    CANCELLED = "cancelled"  # the job has been cancelled (the event was sent, or refused because of it)
    FENCED = "fenced"  # refused: the attempt no longer holds the job


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def sync_client() -> redis.Redis:
    return _client(settings.REDIS_URL)


@lru_cache(maxsize=4)
def _scripts(url: str) -> tuple[Any, Any]:
    client = _client(url)
    return client.register_script(_FENCED_XADD), client.register_script(_DELETE_IF_HOLDS)


def publish(job_id: Any, event: str, data: dict[str, Any]) -> str:
    """An event of the services (not of an attempt): always appended."""
    client = sync_client()
    key = stream_key(job_id)
    with client.pipeline(transaction=False) as pipe:
        pipe.xadd(key, {"event": event, "data": json.dumps(data)}, maxlen=STREAM_MAXLEN, approximate=True)
        pipe.expire(key, settings.APPLIANCE_STREAM_RETENTION_S)
        entry_id = pipe.execute()[0]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def publish_fenced(job_id: Any, event: str, data: dict[str, Any], *, attempt: int | None) -> Outcome:
    """Append an event only while ``attempt`` holds the job (``None``: only while no attempt
    does), and say whether the job was cancelled, in one round trip (a worker does this for
    every batch of tokens)."""
    return publish_fenced_entry(job_id, event, data, attempt=attempt)[0]


def publish_fenced_entry(job_id: Any, event: str, data: dict[str, Any], *, attempt: int | None) -> tuple[Outcome, str]:
    """``publish_fenced``, and the stream id the event was appended under ("" if it was not)."""
    fenced_xadd, _ = _scripts(settings.REDIS_URL)
    appended, entry_id, cancelled = fenced_xadd(
        keys=[stream_key(job_id), fence_key(job_id), cancel_key(job_id)],
        args=["" if attempt is None else str(attempt), event, json.dumps(data), STREAM_MAXLEN,
              settings.APPLIANCE_STREAM_RETENTION_S],
    )  # fmt: skip
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    if cancelled:
        return Outcome.CANCELLED, entry_id
    return (Outcome.SENT if appended else Outcome.FENCED), entry_id


def fence_hold(job_id: Any, attempt: int) -> None:
    """Attempt ``attempt`` holds the job's stream from now on (set by its claim). The key outlives
    the longest attempt, so it never lapses under a running job."""
    ttl_s = settings.APPLIANCE_JOB_TIME_LIMIT_S + settings.APPLIANCE_STREAM_RETENTION_S
    sync_client().set(fence_key(job_id), str(attempt), ex=ttl_s)


def fence_release(job_id: Any, attempt: int | None = None) -> None:
    """No attempt holds the stream any more: the job was handed on or requeued (``attempt``: only
    if that attempt still holds it), or it has finished (``None``: whoever held it)."""
    if attempt is None:
        sync_client().delete(fence_key(job_id))
        return
    delete_if_holds(fence_key(job_id), str(attempt))


def delete_if_holds(key: str, value: str) -> None:
    """Deletes ``key`` only while it holds ``value``, in one step in the broker."""
    _, delete = _scripts(settings.REDIS_URL)
    delete(keys=[key], args=[value])


def request_cancel(job_id: Any) -> None:
    sync_client().set(cancel_key(job_id), "1", ex=settings.APPLIANCE_STREAM_RETENTION_S)


def cancel_requested(job_id: Any) -> bool:
    return bool(sync_client().exists(cancel_key(job_id)))


def format_sse(event: str, data: dict[str, Any], event_id: str | None = None) -> str:
    lines = []
    if event_id:
        lines.append(f"id: {event_id}")
    lines.append(f"event: {event}")
    for line in json.dumps(data).splitlines() or [""]:
        lines.append(f"data: {line}")
    return "\n".join(lines) + "\n\n"


async def read_events(
    job_id: Any, *, after: str = "0", block_ms: int = 15_000
) -> AsyncGenerator[tuple[str, str, dict], None]:
    """Yield (stream id, event, data) after ``after``, waiting for new ones, until a final event.
    Yields ("", "keepalive", {}) when nothing arrived for ``block_ms``."""
    # The read waits up to ``block_ms`` by design: its socket timeout must be longer (redis-py's
    # default of 5 s equals the chat stream's keepalive, and a busy machine lost that race).
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=block_ms / 1000 + 10)
    key = stream_key(job_id)
    last = after or "0"
    try:
        while True:
            response = await client.xread({key: last}, block=block_ms, count=500)
            if not response:
                yield "", "keepalive", {}
                continue
            for entry_id, fields in _entries(response):
                last = entry_id.decode()
                event = fields[b"event"].decode()
                yield last, event, json.loads(fields[b"data"])
                if event in FINAL_EVENTS:
                    return
    finally:
        await client.aclose()


def _entries(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XREAD's answer for the one stream read, as its entries: redis-py types the answer as any
    reply of any protocol; over RESP2 (this client's) it is ``[[key, [(id, fields), ...]]]``."""
    return list(response[0][1])


async def stream_exists(job_id: Any) -> bool:
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5)
    try:
        return bool(await client.exists(stream_key(job_id)))
    finally:
        await client.aclose()


# --- streams open per user ---------------------------------------------------------------------
#
# Each open stream (a job's events, a streamed chat completion) holds a slot: a member of a sorted
# set per user whose score is when its lease ends. A stream renews its lease as it goes and
# gives the slot back when it ends; a web process that dies leaves slots that expire with their
# lease. Counted in the broker, so every web process sees the same count.

STREAM_LEASE_S = 60

# KEYS: the user's set. ARGV: now, lease end, slot, limit. Returns 1 when the slot was taken.
_TAKE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[5]))
return 1
"""
# KEYS: the user's set. ARGV: lease end, slot, lease. The slot is put back if it had gone, and the
# set lives as long as its longest lease.
_RENEW_SLOT = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
return 1
"""


def streams_key(user_id: Any) -> str:
    return f"appliance:streams:{user_id}"


class TooManyStreams(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"You have {limit} streams open, as many as one person may (APPLIANCE_MAX_STREAMS_PER_USER); "
            "close one (another tab, or a client still reading) and try again."
        )
        self.limit = limit


def stream_limit(api_token=None) -> int:
    """Streams one person may have open: the token's own limit (measurement accounts raise it),
    else ``APPLIANCE_MAX_STREAMS_PER_USER`` (0: none)."""
    own = getattr(api_token, "max_streams", None)
    return int(own) if own else settings.APPLIANCE_MAX_STREAMS_PER_USER


# The stream slots' broker client of the running event loop, and the loop and address it is for.
_slot_client: tuple[asyncio.AbstractEventLoop, str, aioredis.Redis] | None = None


def _stream_client() -> aioredis.Redis:
    """The stream slots' broker client for the running event loop: the web server's one loop
    keeps it and its connections. A client made per use connected anew three times a request
    (take, renew, give back), and redis-py read its own version from the package's metadata for
    each one: a tenth of the web process's CPU time under streamed chats (py-spy). Another loop
    (a test's) gets a client of its own; the one it replaces is left to the loop that used it."""
    global _slot_client
    loop = asyncio.get_running_loop()
    if _slot_client is None or _slot_client[0] is not loop or _slot_client[1] != settings.REDIS_URL:
        client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=5)
        _slot_client = (loop, settings.REDIS_URL, client)
    return _slot_client[2]


async def take_stream_slot(user_id: Any, *, api_token=None) -> str | None:
    """A slot for one more stream of ``user_id``; raises ``TooManyStreams`` at the limit. None
    when no limit is set or the broker does not answer (the stream then fails on its own)."""
    limit = stream_limit(api_token)
    if not limit:
        return None
    slot = uuid.uuid4().hex
    client = _stream_client()
    try:
        now = time.time()
        taken = await client.eval(
            _TAKE_SLOT, 1, streams_key(user_id), now, now + STREAM_LEASE_S, slot, limit, STREAM_LEASE_S
        )
    except aioredis.RedisError:
        return None
    if not taken:
        raise TooManyStreams(limit)
    return slot


async def release_stream_slot(user_id: Any, slot: str | None) -> None:
    if slot is None:
        return
    client = _stream_client()
    try:
        await client.zrem(streams_key(user_id), slot)
    except aioredis.RedisError:
        pass  # its lease ends by itself


async def held_stream(user_id: Any, slot: str | None, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, renewing the slot's lease as they go, and giving the slot back at the end."""
    if slot is None:
        async for chunk in events:
            yield chunk
        return
    key = streams_key(user_id)
    client = _stream_client()
    renewed = time.time()
    try:
        async for chunk in events:
            if time.time() - renewed > STREAM_LEASE_S / 3:
                renewed = time.time()
                try:
                    await client.eval(_RENEW_SLOT, 1, key, renewed + STREAM_LEASE_S, slot, STREAM_LEASE_S)
                except aioredis.RedisError:
                    pass
            yield chunk
    finally:
        await release_stream_slot(user_id, slot)
