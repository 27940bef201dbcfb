"""Who may see the figures meant for operators (``/metrics``, ``/healthz``'s parts).

With ``APPLIANCE_METRICS_TOKEN`` set, a scraper must bring it as a bearer token; without, only a
caller on this machine (loopback) counts as one. Staff signed in may see ``/healthz``'s parts too.
Queue depths, job counts, the model, KV use and error texts are not for anyone on the network.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings


def scraper_authorised(request) -> bool:
    """With ``APPLIANCE_METRICS_TOKEN`` set, a scraper must bring it; without, only a scraper on
    this machine is answered (queue depths, users' job counts and the engine's state are not for
    anyone on the network)."""
    token = settings.APPLIANCE_METRICS_TOKEN
    if not token:
        return _from_loopback(request)
    header = request.headers.get("Authorization", "")
    return header.startswith("Bearer ") and hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())


# A request a proxy forwarded (the TLS proxy in front of the appliance, on this same box) comes
# from loopback whoever sent it: only a request with none of these is from this machine itself.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP", "HTTP_X_FORWARDED_HOST")


def _from_loopback(request) -> bool:
    if any(header in request.META for header in FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False  # a Unix socket or nothing: not known to be this machine


def may_see_operations(request) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff) or scraper_authorised(request)
