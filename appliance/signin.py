"""Sign-in with a throttle: a password guessed at, by one name or from one address, is refused for a
while, however right the next guess.

Failures are counted in the broker (Valkey/Redis, as the API's rate limits are), so every web
process sees the same count: ``APPLIANCE_LOGIN_FAILURES_PER_USER`` failures for one user name
within ``APPLIANCE_LOGIN_LOCKOUT_S``, or ``APPLIANCE_LOGIN_FAILURES_PER_ADDRESS`` from one client
address (many names tried from one place), and the sign-in page answers 429 with ``Retry-After``
until the window has passed. A successful sign-in clears its name's count. If the broker does
not answer, sign-in is not throttled (and a warning is logged): people can still work.
"""

from __future__ import annotations

import logging
import math

import redis
from django.conf import settings
from django.contrib.auth import views as auth_views

logger = logging.getLogger(__name__)


def _user_key(username: str) -> str:
    return f"appliance:signin:user:{username.strip().lower()}"


def _address_key(address: str) -> str:
    return f"appliance:signin:address:{address}"


def wait_s(username: str, address: str) -> int | None:
    """Seconds until this name or address may try again, or None if it may now."""
    from inference.streaming import sync_client

    user_key, address_key = _user_key(username), _address_key(address)
    try:
        pipe = sync_client().pipeline()
        pipe.get(user_key)
        pipe.ttl(user_key)
        pipe.get(address_key)
        pipe.ttl(address_key)
        user_count, user_ttl, address_count, address_ttl = pipe.execute()
    except redis.RedisError:
        logger.warning("sign-in: the broker is unreachable; attempts are not throttled")
        return None
    waits = []
    if int(user_count or 0) >= settings.APPLIANCE_LOGIN_FAILURES_PER_USER:
        waits.append(user_ttl)
    if int(address_count or 0) >= settings.APPLIANCE_LOGIN_FAILURES_PER_ADDRESS:
        waits.append(address_ttl)
    return max(1, max(waits)) if waits else None


def record_failure(username: str, address: str) -> None:
    from inference.streaming import sync_client

    window = settings.APPLIANCE_LOGIN_LOCKOUT_S
    try:
        pipe = sync_client().pipeline()
        for key in (_user_key(username), _address_key(address)):
            pipe.incr(key)
            pipe.expire(key, window, nx=True)  # the window starts at the first failure
        pipe.execute()
    except redis.RedisError:
        logger.warning("sign-in: the broker is unreachable; a failed attempt was not counted")


def record_success(username: str) -> None:
    from inference.streaming import sync_client

    try:
        sync_client().delete(_user_key(username))
    except redis.RedisError:
        pass


class SignInView(auth_views.LoginView):
    """Django's sign-in, refused with 429 while its name or address is throttled. With OpenID
    Connect configured it offers "Sign in with <organisation>" beside the form, or instead of it
    (``APPLIANCE_LOCAL_SIGNIN_FORM=false``; the form stays at ``?local=1`` for a break-glass
    administrator)."""

    _OIDC_PROBLEMS = {
        "failed": "Signing in with your organisation did not succeed. Try again, or ask your administrator.",
        "unavailable": "Your organisation's sign-in service does not answer. Try again in a moment.",
    }

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        oidc = bool(settings.APPLIANCE_OIDC_DISCOVERY_URL)
        context["oidc_name"] = settings.APPLIANCE_OIDC_NAME if oidc else None
        context["oidc_problem"] = self._OIDC_PROBLEMS.get(self.request.GET.get("oidc", "")) if oidc else None
        context["local_form"] = (
            not oidc
            or settings.APPLIANCE_LOCAL_SIGNIN_FORM
            or self.request.GET.get("local") == "1"
            or self.request.method == "POST"
        )
        return context

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        address = request.META.get("REMOTE_ADDR", "")
        wait = wait_s(username, address)
        if wait is not None:
            minutes = max(1, math.ceil(wait / 60))
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request),
                    throttled=f"Too many failed sign-ins for this name or from this address. Try again in about "
                    f"{minutes} minute{'s' if minutes != 1 else ''}.",
                ),
                status=429,
            )
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        record_failure(self.request.POST.get("username", ""), self.request.META.get("REMOTE_ADDR", ""))
        return super().form_invalid(form)

    def form_valid(self, form):
        record_success(self.request.POST.get("username", ""))
        return super().form_valid(form)
