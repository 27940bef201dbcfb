"""Token deltas from the worker to the browser, through the broker.

Each job has a Redis stream (``job:<id>:events``). The worker appends ``delta`` events as text
arrives and one final event (``done``, ``failed`` or ``cancelled``). A browser reads it as
server-sent events whose ids are the stream ids, so a browser that reconnects sends
``Last-Event-ID`` and resumes exactly after what it already has. A stream is used rather than
plain pub/sub because pub/sub forgets what was said before a subscriber arrived.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
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


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def sync_client() -> redis.Redis:
    return _client(settings.REDIS_URL)


def publish(job_id: Any, event: str, data: dict[str, Any]) -> str:
    return _publish(job_id, event, data, check_cancel=False)[0]


def publish_and_check_cancel(job_id: Any, event: str, data: dict[str, Any]) -> bool:
    """Append an event and say whether the job was cancelled, in one round trip to the broker
    (a worker does this for every batch of tokens)."""
    return _publish(job_id, event, data, check_cancel=True)[1]


def _publish(job_id: Any, event: str, data: dict[str, Any], *, check_cancel: bool) -> tuple[str, bool]:
    client = sync_client()
    key = stream_key(job_id)
    with client.pipeline(transaction=False) as pipe:
        pipe.xadd(key, {"event": event, "data": json.dumps(data)}, maxlen=STREAM_MAXLEN, approximate=True)
        pipe.expire(key, settings.APPLIANCE_STREAM_RETENTION_S)
        if check_cancel:
            pipe.exists(cancel_key(job_id))
        replies = pipe.execute()
    entry_id = replies[0]
    return (entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)), bool(check_cancel and replies[2])


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


async def read_events(job_id: Any, *, after: str = "0", block_ms: int = 15_000) -> AsyncIterator[tuple[str, str, dict]]:
    """Yield (stream id, event, data) after ``after``, waiting for new ones, until a final event.
    Yields ("", "keepalive", {}) when nothing arrived for ``block_ms``."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5)
    key = stream_key(job_id)
    last = after or "0"
    try:
        while True:
            response = await client.xread({key: last}, block=block_ms, count=500)
            if not response:
                yield "", "keepalive", {}
                continue
            for entry_id, fields in response[0][1]:
                last = entry_id.decode()
                event = fields[b"event"].decode()
                yield last, event, json.loads(fields[b"data"])
                if event in FINAL_EVENTS:
                    return
    finally:
        await client.aclose()


async def stream_exists(job_id: Any) -> bool:
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5)
    try:
        return bool(await client.exists(stream_key(job_id)))
    finally:
        await client.aclose()
