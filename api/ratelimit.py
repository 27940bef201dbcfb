"""Rate limits of the API: per token, and per user for calls a browser session signs (the page's
own scripts, or anyone scripting with a session cookie). A fixed one-minute window counted in the
broker (Valkey/Redis), so every web process sees the same count."""

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
    until the window ends when it is not. A token given a limit of its own (by an administrator)
    is counted alone; a person's tokens with the default limit share one count, so that making
    more tokens buys no more requests. Lets the request through if the broker is unreachable
    (the job itself then fails to queue, with its own message)."""
    if token.rate_limit_per_minute is not None:
        key, what = f"appliance:ratelimit:{token.prefix}", f"token {token.prefix}"
    else:
        key, what = f"appliance:ratelimit:user:{token.user_id}", f"user {token.user_id}'s tokens"
    return _count(key, limit_of(token), what=what, now=now)


def session_limit() -> int:
    return settings.APPLIANCE_SESSION_API_RATE_LIMIT_PER_MINUTE


def hit_session(user_id: int, *, now: float | None = None) -> int | None:
    """Count one API request a session of user ``user_id`` signed; as ``hit``."""
    return _count(f"appliance:ratelimit:session:{user_id}", session_limit(), what=f"user {user_id}", now=now)


def _count(prefix: str, limit: int, *, what: str, now: float | None) -> int | None:
    from inference.streaming import sync_client

    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    key = f"{prefix}:{window}"
    try:
        pipe = sync_client().pipeline()
        pipe.incr(key)
        pipe.expire(key, WINDOW_S * 2)
        count, _ = pipe.execute()
    except redis.RedisError:
        logger.warning("rate limit: the broker is unreachable; %s not counted", what)
        return None
    if count <= limit:
        return None
    return max(1, math.ceil((window + 1) * WINDOW_S - now))
