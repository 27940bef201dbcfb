"""Per-token rate limit: a fixed one-minute window counted in the broker (Valkey/Redis), so every
web process sees the same count."""

from __future__ import annotations

import logging
import math
import time

import redis
from django.conf import settings

from api.models import ApiToken

logger = logging.getLogger(__name__)
WINDOW_S = 60


def limit_of(token: ApiToken) -> int:
    if token.rate_limit_per_minute is not None:
        return token.rate_limit_per_minute
    return settings.APPLIANCE_API_RATE_LIMIT_PER_MINUTE


def hit(token: ApiToken, *, now: float | None = None) -> int | None:
    """Count one request of ``token``. Returns None when it is within the limit, or the seconds
    until the window ends when it is not. Lets the request through if the broker is unreachable
    (the job itself then fails to queue, with its own message)."""
    from inference.streaming import sync_client

    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    key = f"appliance:ratelimit:{token.prefix}:{window}"
    try:
        pipe = sync_client().pipeline()
        pipe.incr(key)
        pipe.expire(key, WINDOW_S * 2)
        count, _ = pipe.execute()
    except redis.RedisError:
        logger.warning("rate limit: the broker is unreachable; token %s not counted", token.prefix)
        return None
    if count <= limit_of(token):
        return None
    return max(1, math.ceil((window + 1) * WINDOW_S - now))
