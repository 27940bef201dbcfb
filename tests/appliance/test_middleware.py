"""Under ASGI the middleware runs in the event loop: no thread hand-over for a step that needs
none, and none of the browser's middleware for a bearer token's API request
(``appliance/middleware.py``). Each hand-over waits for a CPU on a box the engine keeps busy."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import SyncToAsync, iscoroutinefunction
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.test import AsyncClient, Client
from django.utils.module_loading import import_string

from api.services import token_create
from appliance.checks import security_middleware_installed

MIDDLEWARE_STEPS = (
    "SecurityMiddleware.",
    "SessionMiddleware.",
    "CommonMiddleware.",
    "CsrfViewMiddleware.",
    "AuthenticationMiddleware.",
    "MessageMiddleware.",
    "XFrameOptionsMiddleware.",
    "WhiteNoiseMiddleware.",
    "StaticFiles.",
    "convert_exception_to_response.",  # a sync-only middleware: the chain above it runs in a thread
)


def _bearer(user) -> dict:
    _, raw = token_create(user=user, name="a tool", scopes=["read", "write"])
    return {"Authorization": f"Bearer {raw}"}


@pytest.fixture(autouse=True)
def _closed_after():
    """AsyncClient runs the sync parts in a thread of its own: close that thread's connections,
    so that the test database can be dropped."""
    yield
    asyncio.run(SyncToAsync(connections.close_all, thread_sensitive=True)())


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """The name of every function handed from the event loop to a thread (``sync_to_async``)."""
    names: list[str] = []
    handed_over = SyncToAsync.__call__

    async def spy(self, *args, **kwargs):
        names.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await handed_over(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", spy)
    return names


def test_every_middleware_can_run_in_the_event_loop():
    """A sync-only middleware anywhere in ``MIDDLEWARE`` (WhiteNoise's own is one) makes Django
    run the chain above it in the request's thread and the rest back in the loop."""
    for path in settings.MIDDLEWARE:
        # Django's default for a middleware that says nothing is sync only.
        assert getattr(import_string(path), "async_capable", False), path
    handler = ASGIHandler()
    assert handler._view_middleware and all(iscoroutinefunction(step) for step in handler._view_middleware)


@pytest.mark.django_db(transaction=True)
def test_a_bearer_api_request_passes_the_middleware_in_the_event_loop(alice, hops):
    headers = _bearer(alice)
    response = asyncio.run(AsyncClient().get("/api/v1/documents", headers=headers))
    assert response.status_code == 200, response.content
    assert not [name for name in hops if name.startswith(MIDDLEWARE_STEPS)], hops
    # What the inline steps add is still there; the browser's session is not.
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert "Content-Security-Policy" in response
    assert "Set-Cookie" not in response and "Cookie" not in response.get("Vary", "")

    # A browser's request still goes through its session's steps in the request's thread (the
    # session may be read from the database): the spy sees them.
    hops.clear()
    response = asyncio.run(AsyncClient().get("/api/v1/documents"))
    assert response.status_code == 401
    assert "SessionMiddleware.process_request" in hops


@pytest.mark.django_db(transaction=True)
def test_a_static_file_is_served_under_asgi_and_other_requests_go_on():
    response = asyncio.run(AsyncClient().get("/static/app.css"))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/css")
    assert asyncio.run(AsyncClient().get("/static/no-such-file.css")).status_code == 404  # past it, to the URLs


@pytest.mark.django_db
def test_a_wrong_bearer_token_is_refused_even_beside_a_signed_in_session(alice):
    client = Client()
    client.force_login(alice)
    assert client.get("/api/v1/documents").status_code == 200  # the session alone signs it in
    response = client.get("/api/v1/documents", HTTP_AUTHORIZATION="Bearer dapp_00000000_not-a-token")
    assert response.status_code == 401, response.content
    # A page is the browser's whatever it carries: the session still signs it in.
    assert client.get("/documents/", HTTP_AUTHORIZATION="Bearer dapp_00000000_not-a-token").status_code == 200


def test_the_check_asks_for_the_security_middleware_by_class_not_by_path(settings):
    """Django's own checks look for its middleware by path and cannot see the subclasses the
    appliance installs; ``appliance.checks`` asks of the classes, and errs without one."""
    assert security_middleware_installed(None) == []
    settings.MIDDLEWARE = [path for path in settings.MIDDLEWARE if not path.endswith(".CsrfViewMiddleware")]
    (error,) = security_middleware_installed(None)
    assert error.id == "appliance.E001" and "CsrfViewMiddleware" in error.msg
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]  # Django's own counts
    assert security_middleware_installed(None) == []
