"""Errors in one format: RFC 9457 problem details (``application/problem+json``).

Every error the API returns has ``type``, ``title``, ``status`` and a ``detail`` a person can act
on; a 400 names the fields in ``errors``. On the OpenAI-compatible routes (``/v1/...``) the body
also carries OpenAI's ``error`` object (an extension member), so that OpenAI clients show the
same message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http import HTTPStatus

from django.http import HttpRequest, HttpResponse
from ninja import Schema

CONTENT_TYPE = "application/problem+json"

# code -> (title, what it means and what to do); each type URI is served at /api/problems/<code>.
PROBLEM_TYPES: dict[str, tuple[str, str]] = {
    "bad-request": (
        "The request is not valid",
        "A field is missing or has a value the appliance does not accept; `errors` names each field.",
    ),
    "unauthenticated": (
        "Authentication required",
        "Send `Authorization: Bearer <token>` with an active personal API token, or sign in.",
    ),
    "insufficient-scope": (
        "The token lacks a scope",
        "The token authenticates, but this operation needs a scope it was not given. Create a token with that scope.",
    ),
    "forbidden": (
        "Not allowed",
        "You may see this resource but not change it in this way (for example, only its owner may delete a document).",
    ),
    "not-found": ("Not found", "There is no such resource, or you may not read it; the appliance does not say which."),
    "conflict": (
        "Conflict",
        "The resource is in a state that does not allow this (for example, cancelling a finished job).",
    ),
    "upload-too-large": (
        "The upload is too large",
        "The file is over the appliance's upload limit (`APPLIANCE_MAX_UPLOAD_MB`).",
    ),
    "rate-limited": (
        "Too many requests",
        "The token's requests per minute (or, for calls a browser session signs, your session's) are used up. "
        "Wait for `Retry-After` seconds.",
    ),
    "storage-quota": (
        "Your storage is full",
        "Your documents take as many bytes as one person may store (`APPLIANCE_MAX_STORAGE_MB_PER_USER`). "
        "Delete documents you no longer need.",
    ),
    "ingest-queue-full": (
        "Too many documents waiting",
        "As many of your documents are waiting to be read as one person may have "
        "(`APPLIANCE_MAX_INGESTING_PER_USER`). Try again after `Retry-After` seconds.",
    ),
    "too-many-streams": (
        "Too many streams open",
        "You have as many streams open as one person may (`APPLIANCE_MAX_STREAMS_PER_USER`). Close one and "
        "try again after `Retry-After` seconds.",
    ),
    "queue-full": (
        "The appliance is busy",
        "Too many jobs are waiting in this queue, or you already have as many waiting there as one person "
        "may (`APPLIANCE_MAX_QUEUED_PER_USER`); `detail` says which. Try again after `Retry-After` seconds.",
    ),
    "idempotency-key-reused": (
        "Idempotency-Key reused",
        "This Idempotency-Key was used before with a different request. Use a new key for a new request.",
    ),
    "method-not-allowed": ("Method not allowed", "This path does not accept this HTTP method."),
    "model-failed": (
        "The model could not answer",
        "The job that ran the request failed; `detail` says why. Retrying may help if the cause was passing.",
    ),
    "unavailable": (
        "Service unavailable",
        "A part of the appliance (the engine host or the broker) does not answer, so nothing was queued or "
        "stored. Try again after `Retry-After` seconds.",
    ),
    "server-error": (
        "Internal error",
        "Something failed inside the appliance; the error is logged. Try again, and tell the administrator if it persists.",
    ),
}


class FieldError(Schema):
    field: str
    message: str


class Problem(Schema):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = None
    error: dict | None = None  # on /v1 routes: OpenAI's error object {message, type, param, code}


@dataclass
class ApiProblem(Exception):
    """Raise in an endpoint to answer with a problem."""

    status: int
    code: str
    detail: str
    errors: list[dict] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def type_uri(code: str) -> str:
    return f"/api/problems/{code}"


def problem_body(*, status: int, code: str, detail: str, instance: str) -> dict:
    title = PROBLEM_TYPES.get(code, (HTTPStatus(status).phrase, ""))[0]
    return {"type": type_uri(code), "title": title, "status": status, "detail": detail, "instance": instance}


def problem_response(
    request: HttpRequest,
    *,
    status: int,
    code: str,
    detail: str,
    errors: list[dict] | None = None,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    body = problem_body(status=status, code=code, detail=detail, instance=request.path)
    if errors:
        body["errors"] = errors
    if request.path.startswith("/v1/"):
        param = errors[0]["field"] if errors else None
        body["error"] = {"message": detail, "type": code.replace("-", "_"), "param": param, "code": code}
    response = HttpResponse(json.dumps(body), status=status, content_type=CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def not_found(what: str = "resource") -> ApiProblem:
    return ApiProblem(404, "not-found", f"No such {what}.")


def bad_field(name: str, message: str) -> ApiProblem:
    return ApiProblem(400, "bad-request", f"{name}: {message}", errors=[{"field": name, "message": message}])


def responses(*codes: int, ok: dict | None = None) -> dict:
    """An operation's responses for the schema: its successes and the problems it can answer
    (every one: a bad request, no credentials, a missing scope, the rate limit)."""
    documented = dict(ok or {})
    for code in (400, 401, 403, 429, *codes):  # any caller may lack a scope or exceed its rate
        documented[code] = Problem
    return documented
