"""The appliance's HTTP API: ``/api/v1`` for internal tools and ``/v1`` for OpenAI-compatible
clients, one django-ninja instance, one OpenAPI 3 schema at ``/api/schema`` (docs for staff at
``/api/docs``), one error format (``api.problems``).

Why django-ninja rather than DRF: the request and response shapes are pydantic models, which
validate the input, write the schema and serialise the output from one declaration (pydantic is
already in the appliance through vLLM); each operation lists the problems it can answer, so the
schema documents every error; and async operations stream server-sent events without a second
stack.
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from api.problems import CONTENT_TYPE, ApiProblem, problem_response
from appliance.broker import BrokerUnavailable
from console.views import staff_only
from documents.services import NotAllowed, UploadRejected
from inference.engine.client import EngineUnavailable
from inference.services import JobRejected, QueueFull
from inference.streaming import TooManyStreams

logger = logging.getLogger(__name__)

SOURCES = {"body", "query", "path", "header", "form", "file", "cookie"}


def field_name(loc) -> str:
    """A pydantic error location as the name a caller sent: ``("body", "payload", "length")``
    -> ``length``; ``("query", "page")`` -> ``page``."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in SOURCES:
        source, parts = parts[0], parts[1:]
        if parts and parts[0] == "payload":
            parts = parts[1:]
        if not parts:
            return source
    return ".".join(parts) or "body"


class ApplianceAPI(NinjaAPI):
    def get_openapi_schema(self, *args, **kwargs):
        """Errors are documented as what they are: ``application/problem+json``."""
        schema = super().get_openapi_schema(*args, **kwargs)
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                for code, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if str(code) >= "400" and "application/json" in content:
                        content[CONTENT_TYPE] = content.pop("application/json")
        return schema


api = ApplianceAPI(
    title="Document appliance API",
    version="1",
    description=(
        "Documents, search and jobs (summaries, clause extraction, drafted replies) for internal tools, "
        "and an OpenAI-compatible chat completions endpoint. Authenticate with a personal API token "
        "(`Authorization: Bearer dapp_…`, created under *API tokens* in the web UI). Every error is an "
        "RFC 9457 problem (`application/problem+json`)."
    ),
    urls_namespace="api",
    openapi_url="/api/schema",
    docs_url="/api/docs",
    docs_decorator=staff_only,
)


@api.exception_handler(ApiProblem)
def _problem(request, exc: ApiProblem):
    return problem_response(
        request, status=exc.status, code=exc.code, detail=exc.detail, errors=exc.errors, headers=exc.headers
    )


@api.exception_handler(ValidationError)
def _invalid(request, exc: ValidationError):
    errors = [{"field": field_name(e.get("loc", ())), "message": str(e.get("msg", "invalid"))} for e in exc.errors]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "The request is not valid."
    return problem_response(request, status=400, code="bad-request", detail=detail, errors=errors)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return problem_response(
        request,
        status=401,
        code="unauthenticated",
        detail="No valid credentials: send `Authorization: Bearer <token>` with an active API token.",
        headers={"WWW-Authenticate": 'Bearer realm="appliance"'},
    )


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    code = {400: "bad-request", 403: "forbidden", 404: "not-found", 405: "method-not-allowed"}.get(
        exc.status_code, "bad-request" if exc.status_code < 500 else "server-error"
    )
    errors = None
    if exc.status_code == 400 and str(exc).startswith("Cannot parse request body"):
        errors = [{"field": "body", "message": "not valid JSON (or not the content type it claims)"}]
        return problem_response(
            request, status=400, code=code, detail="body: the request body is not valid JSON.", errors=errors
        )
    return problem_response(request, status=exc.status_code, code=code, detail=str(exc))


@api.exception_handler(MultiPartParserError)
def _bad_multipart(request, exc):
    return problem_response(
        request,
        status=400,
        code="bad-request",
        detail=f"body: not a readable multipart form ({exc}).",
        errors=[{"field": "body", "message": "not a readable multipart form"}],
    )


@api.exception_handler(SuspiciousOperation)
def _suspicious(request, exc):
    return problem_response(request, status=400, code="bad-request", detail=f"body: {exc}")


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return problem_response(request, status=413, code="upload-too-large", detail=str(exc))


@api.exception_handler(Http404)
def _not_found(request, exc):
    return problem_response(request, status=404, code="not-found", detail=str(exc) or "Not found.")


@api.exception_handler(QueueFull)
def _queue_full(request, exc: QueueFull):
    return problem_response(
        request, status=429, code="queue-full", detail=str(exc), headers={"Retry-After": str(exc.retry_after_s)}
    )


@api.exception_handler(BrokerUnavailable)
def _broker_down(request, exc: BrokerUnavailable):
    # Nothing was written (or what was written was taken back): the caller may simply retry.
    return problem_response(
        request, status=503, code="unavailable", detail=str(exc), headers={"Retry-After": str(exc.retry_after_s)}
    )


@api.exception_handler(JobRejected)
def _job_rejected(request, exc: JobRejected):
    errors = [{"field": exc.field, "message": str(exc)}] if exc.field else None
    detail = f"{exc.field}: {exc}" if exc.field else str(exc)
    return problem_response(request, status=400, code="bad-request", detail=detail, errors=errors)


@api.exception_handler(UploadRejected)
def _upload_rejected(request, exc: UploadRejected):
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return problem_response(request, status=exc.status, code=exc.code, detail=str(exc), headers=headers)


@api.exception_handler(TooManyStreams)
def _too_many_streams(request, exc: TooManyStreams):
    return problem_response(
        request, status=429, code="too-many-streams", detail=str(exc), headers={"Retry-After": "30"}
    )


@api.exception_handler(NotAllowed)
def _not_allowed(request, exc):
    return problem_response(request, status=403, code="forbidden", detail=str(exc))


@api.exception_handler(EngineUnavailable)
def _engine_down(request, exc):
    return problem_response(
        request,
        status=503,
        code="unavailable",
        detail="The engine host does not answer.",
        headers={"Retry-After": "10"},
    )


@api.exception_handler(Exception)
def _server_error(request, exc):
    logger.exception("API error on %s %s", request.method, request.path)
    return problem_response(request, status=500, code="server-error", detail="Something failed inside the appliance.")


def _register_routers() -> None:
    from api.endpoints import router as appliance_router
    from documents.api import router as documents_router
    from documents.api import search_router
    from documents.batch_api import router as batches_router
    from inference.api import router as jobs_router
    from inference.openai_api import router as openai_router

    api.add_router("/api/v1/documents", documents_router, tags=["documents"])
    api.add_router("/api/v1/search", search_router, tags=["documents"])
    api.add_router("/api/v1/batches", batches_router, tags=["documents"])
    api.add_router("/api/v1/jobs", jobs_router, tags=["jobs"])
    api.add_router("/api/v1", appliance_router)
    api.add_router("/v1", openai_router, tags=["openai"])


_register_routers()
