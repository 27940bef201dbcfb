"""What a publish to the broker raises when the broker is not there.

kombu wraps connection errors in its ``OperationalError``; redis-py and the socket layer raise
their own. Whoever publishes a message that must not be lost catches these and leaves the job
for the watchdog (``inference.lifecycle``).
"""

from __future__ import annotations

import redis
from kombu.exceptions import OperationalError

PUBLISH_ERRORS = (OperationalError, redis.RedisError, OSError)
