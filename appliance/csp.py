"""A Content-Security-Policy on every page: scripts, styles, images and connections from the
appliance itself only, no plugins, no framing, forms posted only to itself.

Model output is sanitised before it is shown (``rendering``); this is the second wall: should
anything slip through, a browser still runs no script that is not one of the appliance's own
files (no inline script, no ``eval``), loads nothing from elsewhere and sends no form elsewhere.
Inline ``style`` attributes are allowed (a few inputs are sized by them; they run no code).
Django 5.2 has no CSP of its own (6.0 does); this is one header.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ]
)
# The API's interactive documentation (django-ninja's Swagger page, staff only) is built from an
# inline script; it is a page of the API's own, not of model output.
EXEMPT_PREFIXES = ("/api/docs",)


def _with_policy(request, response):
    if "Content-Security-Policy" not in response and not request.path.startswith(EXEMPT_PREFIXES):
        response["Content-Security-Policy"] = POLICY
    return response


@sync_and_async_middleware
def content_security_policy(get_response):
    """Async where the stack is (the job streams are async views: a sync middleware would hold a
    thread for each of them)."""
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            return _with_policy(request, await get_response(request))

        return async_middleware

    def middleware(request):
        return _with_policy(request, get_response(request))

    return middleware
