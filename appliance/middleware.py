"""Django's own middleware, without a thread hop per step where none is needed.

Under ASGI, a middleware built on Django's ``MiddlewareMixin`` runs each of its steps
(``process_request``, ``process_view``, ``process_response``) through ``sync_to_async``: a
hand-over to the request's thread and back, ten of them before a view and six after with the
stack in ``settings.MIDDLEWARE``. Worse, WhiteNoise's middleware is sync only, so Django ran
everything above it in the request's thread and everything below it back in the event loop. On
an idle box each hand-over costs well under a millisecond; on a box whose cores the engine
keeps busy, it waits for a CPU and for Python's interpreter lock. Measured on ``make run`` (2
cores, a client keeping four streamed chats open): from a ``/v1`` request's arrival to its
token's check, 16-20 ms at the median and 284-407 ms at the 90th percentile, time to first token
that a client sees and ``vllm serve`` does not have; 3.1 and 8.1 ms with this module.

Three ways out, each only where it is safe:

- WhiteNoise's middleware serves static files as before, and lets every other request go on in
  the event loop (``StaticFiles``).
- Steps that only read the request and set headers (security headers, ``APPEND_SLASH``,
  ``X-Frame-Options``) do no I/O, so they run in the event loop itself (``Inline``).
- A request that a bearer token signs to the API (``/v1/``, ``/api/``) is a program's, not a
  browser's: it has no session, no CSRF cookie and no flash messages, and its user is the
  token's (``api.auth.TokenAuth``). The session, CSRF, user and message middleware let it
  through untouched (``BrowserOnly``); a wrong token is then a 401, even with a browser's
  session cookie beside it, as the client said who it is and was wrong. A browser's requests
  go through them as before, hops and all (a session may be read or saved from the database).

Django's deploy checks look for its security, clickjacking and CSRF middleware by their paths in
``MIDDLEWARE`` and cannot see these subclasses; ``appliance.checks`` asks the same of the
classes instead, as an error.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest
from django.middleware import clickjacking, common, csrf, security
from whitenoise.middleware import WhiteNoiseMiddleware  # type: ignore[import-untyped]

from appliance.body_limit import API_PREFIXES


def bearer_api_request(request: HttpRequest) -> bool:
    """Whether ``request`` goes to the API with a bearer token (as django-ninja's ``HttpBearer``
    reads the header: its first word, in any case, is ``Bearer``)."""
    if not request.path.startswith(API_PREFIXES):
        return False
    scheme, _, _ = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer"


class Inline:
    """A ``MiddlewareMixin`` whose steps do no I/O: under ASGI they run in the event loop."""

    async def __acall__(self, request):
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class BrowserOnly:
    """A ``MiddlewareMixin`` for browsers' requests only: a bearer token's API request passes
    through it untouched, in either mode, with no hop."""

    def __call__(self, request):
        if bearer_api_request(request):
            return self.get_response(request)  # under ASGI, the awaitable the caller awaits
        return super().__call__(request)


class StaticFiles(WhiteNoiseMiddleware):
    """WhiteNoise's middleware, async-capable: only a static file's request leaves the loop (to
    open the file; with ``autorefresh``, to look for it too)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, **kwargs) -> None:
        super().__init__(get_response, **kwargs)
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file, thread_sensitive=False)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)


class SecurityMiddleware(Inline, security.SecurityMiddleware):
    pass


class CommonMiddleware(Inline, common.CommonMiddleware):
    pass


class XFrameOptionsMiddleware(Inline, clickjacking.XFrameOptionsMiddleware):
    pass


class SessionMiddleware(BrowserOnly, sessions.SessionMiddleware):
    pass


class CsrfViewMiddleware(BrowserOnly, csrf.CsrfViewMiddleware):
    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        if self.async_mode:
            # The handler adapts each middleware's process_view once, by its kind: an async one
            # is awaited in the loop, a sync one is a hop for every request, bearer or not.
            browsers_view = sync_to_async(super().process_view, thread_sensitive=True)

            async def process_view(request, view, args, kwargs):
                if bearer_api_request(request):
                    return None
                return await browsers_view(request, view, args, kwargs)

            self.process_view = process_view  # type: ignore[method-assign]

    def process_view(self, request, view, args, kwargs):  # the sync mode's (WSGI, the test client)
        if bearer_api_request(request):
            return None
        return super().process_view(request, view, args, kwargs)


class AuthenticationMiddleware(BrowserOnly, auth.AuthenticationMiddleware):
    pass


class MessageMiddleware(BrowserOnly, messages.MessageMiddleware):
    pass
