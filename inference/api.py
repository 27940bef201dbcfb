"""``/api/v1/jobs``: start a summary, a clause extraction or a drafted reply; list, read, cancel,
and stream a job as server-sent events. Jobs are their owner's alone: anyone else's is 404.

``Idempotency-Key`` on a create: the same key with the same request returns the same job (200,
``Idempotent-Replayed: true``) instead of starting another; the same key with another request
is refused (422). Keys are kept for a day.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Header, Query, Router, Schema, Status

from api import auth
from api.pagination import MAX_PAGE, Paginated, paginate
from api.problems import ApiProblem, not_found, responses
from documents.api import readable_document
from inference import events, grounding, job_results, selectors, services, streaming
from inference.clauses import DEFAULT_TAXONOMY, TAXONOMIES
from inference.drafting import MESSAGE_MAX_CHARS
from inference.job_results import DraftResult, result_for
from inference.models import IdempotencyKey, Job, JobKind
from inference.prompts import (
    DEFAULT_DRAFT_LENGTH,
    DEFAULT_DRAFT_TONE,
    DEFAULT_SUMMARY_LENGTH,
)

router = Router()

IDEMPOTENCY_KEY_MAX = 255
SSE_CONTENT = {"text/event-stream": {"schema": {"type": "string"}}}


# Literals, not the model's choices: two enums named "State" would be one component of the schema.
# Written out so that a type checker reads them; tests/api/test_api_types.py keeps each equal to
# the values the code accepts (the prompts' lengths and tones, the taxonomies, the model's choices).
SummaryLength = Literal["short", "standard", "detailed"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Kind = Literal["summarise", "extract_clauses", "draft", "chat"]
QueueName = Literal["prefill", "decode"]
Taxonomy = Literal["cuad", "office"]
Tone = Literal["neutral", "formal", "friendly", "firm"]
DraftLength = Literal["short", "standard", "detailed"]


class SummaryIn(Schema):
    document_id: int
    length: SummaryLength = Field(DEFAULT_SUMMARY_LENGTH)
    focus: str = Field("", max_length=500, description="What the summary should dwell on, if anything.")
    max_tokens: int | None = Field(
        None, ge=1, description="The most tokens to write (at most the appliance's summary length, 256 by default)."
    )
    ignore_eos: bool = Field(
        False,
        description="Write exactly `max_tokens` tokens, past the end of the summary: for load tests such as "
        "`manage.py specsheet` (vLLM's extension of the same name).",
    )


class ClausesIn(Schema):
    document_id: int
    taxonomy: Taxonomy = Field(DEFAULT_TAXONOMY, description="office (5 categories) or cuad (46)")
    categories: list[str] | None = Field(
        None, max_length=max(len(t) for t in TAXONOMIES.values()), description="Only these categories of the taxonomy."
    )


class DraftIn(Schema):
    message: str = Field(
        ..., min_length=1, max_length=MESSAGE_MAX_CHARS, description="The incoming message to reply to."
    )
    document_ids: list[int] = Field(
        default_factory=list, max_length=services.DRAFT_MAX_DOCUMENTS, description="Ground on these documents..."
    )
    group_id: int | None = Field(None, description="...or on the documents shared with this group of yours.")
    tone: Tone = Field(DEFAULT_DRAFT_TONE)
    length: DraftLength = Field(DEFAULT_DRAFT_LENGTH)


class QueuePlace(Schema):
    position: int = Field(description="1-based place in the job's queue.")
    eta_s: float | None = Field(description="Seconds until it finishes, from the last hour's jobs; null before any.")


class JobMetrics(Schema):
    queue_wait_ms: float
    admission_wait_ms: float
    ttft_ms: float = Field(description="Job created -> first token.")
    prefill_ms: float | None
    itl_mean_ms: float | None
    itl_p95_ms: float | None
    decode_tokens_per_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    kv_reservation_tokens: int
    preemptions: int
    engine_requests: int
    model: str


class JobResult(Schema):
    text: str = Field(description="The answer (a draft as its author last edited it).")
    note: str
    data: dict = Field(
        description="Per kind: a summary's `statements` with pages; the `clauses` with quote, page and "
        "category; a draft's checked `sentences`, `support` and cited `passages`."
    )


class JobLinks(Schema):
    self: str
    stream: str
    page: str


class JobOut(Schema):
    id: UUID
    kind: Kind
    queue: QueueName
    state: JobState
    document_id: int | None
    options: dict
    error: str
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    queue_place: QueuePlace | None = Field(description="While queued.")
    result: JobResult | None = Field(description="Once finished successfully.")
    metrics: JobMetrics | None
    links: JobLinks


class JobPage(Paginated):
    results: list[JobOut]


def _result_data(result: job_results.JobResult, user, readable: set[int] | None = None) -> dict:
    """What the row holds (``job_results``), as stored; a draft as its author last edited it.
    ``readable``: the documents ``user`` may read among those the draft cites, when the caller
    has looked them up already (a page of jobs, in one query)."""
    data = result.to_json()
    if isinstance(result, DraftResult):
        if result.edited_text:  # the author's edit and its check are what the draft now is
            data["sentences"] = data.get("edited_sentences")
            data["support"] = data.get("edited_support")
        if readable is None:
            readable = grounding.readable_ids(user, [p.document_id for p in result.passages])
        # A passage of a document the reader may no longer read keeps its number, not its text.
        data["passages"] = [
            p.to_json() if p.document_id in readable else {"number": p.number, "readable": False}
            for p in result.passages
        ]
        for name in ("edited_text", "edited_sentences", "edited_support"):
            data.pop(name, None)
    return data


def _cited_documents(jobs) -> set[int]:
    """The documents the finished drafts among ``jobs`` cite."""
    cited: set[int] = set()
    for job in jobs:
        if job.state == Job.State.SUCCEEDED and job.kind == JobKind.DRAFT:
            typed = result_for(job.kind, job.result_data)
            if isinstance(typed, DraftResult):
                cited.update(p.document_id for p in typed.passages)
    return cited


def job_out(request, job: Job, *, orders: dict | None = None, readable: set[int] | None = None) -> dict:
    """``orders`` and ``readable``: what a page of jobs looks up once for all of them (each
    queue's order; the cited documents the reader may read)."""
    metrics = getattr(job, "metrics", None)
    result = None
    if job.state == Job.State.SUCCEEDED:
        typed = result_for(job.kind, job.result_data)
        text = (typed.edited_text if isinstance(typed, DraftResult) else None) or job.result_text
        result = {"text": text, "note": job.result_note, "data": _result_data(typed, request.user, readable)}
    return {
        "id": job.pk,
        "kind": job.kind,
        "queue": job.queue,
        "state": job.state,
        "document_id": job.document_id,
        "options": job.options,
        "error": job.error,
        "attempts": job.attempts,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "queue_place": selectors.job_queue_status(job, orders=orders) if job.state == Job.State.QUEUED else None,
        "result": result,
        "metrics": None if metrics is None else {name: getattr(metrics, name) for name in JobMetrics.model_fields},
        "links": {
            "self": request.build_absolute_uri(f"/api/v1/jobs/{job.pk}"),
            "stream": request.build_absolute_uri(f"/api/v1/jobs/{job.pk}/stream"),
            "page": request.build_absolute_uri(reverse("inference:job", kwargs={"job_id": job.pk})),
        },
    }


def _own_job(request, job_id: UUID) -> Job:
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise not_found("job")
    return job


def _request_sha256(request) -> str:
    return hashlib.sha256(b"\n".join([request.method.encode(), request.path.encode(), request.body])).hexdigest()


def _created(request, response: HttpResponse, key: str | None, create) -> Status[dict]:
    """Create a job, or with an ``Idempotency-Key`` return the job that key made before."""
    status, body = _create_once(request, key, create)
    response["Location"] = body["links"]["self"]
    if status == 200:
        response["Idempotent-Replayed"] = "true"
    return Status(status, body)


def _create_once(request, key: str | None, create) -> tuple[int, dict]:
    if key is None:
        return 201, job_out(request, create())
    key = key.strip()
    if not key or len(key) > IDEMPOTENCY_KEY_MAX:
        raise ApiProblem(
            400,
            "bad-request",
            f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} characters.",
            errors=[{"field": "Idempotency-Key", "message": f"1 to {IDEMPOTENCY_KEY_MAX} characters"}],
        )
    fingerprint = _request_sha256(request)
    keys = IdempotencyKey.objects.filter(owner=request.user, key=key)
    keys.filter(created_at__lt=timezone.now() - timedelta(hours=IdempotencyKey.TTL_HOURS)).delete()
    earlier = keys.first()
    if earlier is None:
        try:
            with transaction.atomic():
                job = create()
                IdempotencyKey.objects.create(owner=request.user, key=key, request_sha256=fingerprint, job=job)
            return 201, job_out(request, job)
        except IntegrityError:  # the same key in a request running at the same moment: it won
            earlier = keys.first()
            if earlier is None:
                raise ApiProblem(
                    409, "conflict", "A request with this Idempotency-Key is being processed; retry it."
                ) from None
    # The key was used before: its job, whatever has changed since (the queue filling up, a share
    # withdrawn), or a refusal if the request is not the same.
    if earlier.request_sha256 != fingerprint:
        raise ApiProblem(
            422,
            "idempotency-key-reused",
            "This Idempotency-Key was used with a different request; use a new key for a new request.",
        )
    return 200, job_out(request, _own_job(request, earlier.job_id))


CREATE_RESPONSES = responses(404, 409, 422, 429, 503, ok={200: JobOut, 201: JobOut})
IDEMPOTENCY_HELP = "Send the same key again (with the same body) to get the same job back instead of a new one."


@router.post("/summary", response=CREATE_RESPONSES, auth=auth.WRITE, summary="Summarise a document")
def create_summary(
    request,
    response: HttpResponse,
    payload: SummaryIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_HELP),
):
    """Queue a summary (prefill queue). Follow `links.stream` for the text as it is written."""

    def create():
        document = readable_document(request, payload.document_id, field="document_id")
        return services.job_create_summary(
            owner=request.user,
            document=document,
            length=payload.length,
            focus=payload.focus,
            max_tokens=payload.max_tokens,
            ignore_eos=payload.ignore_eos,
            api_token=request.api_token,
        )

    return _created(request, response, idempotency_key, create)


@router.post("/clauses", response=CREATE_RESPONSES, auth=auth.WRITE, summary="Extract clauses from a document")
def create_clauses(
    request,
    response: HttpResponse,
    payload: ClausesIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_HELP),
):
    """Queue a clause extraction (prefill queue): each clause found with its verified quote and page."""

    def create():
        document = readable_document(request, payload.document_id, field="document_id")
        return services.job_create_clauses(
            owner=request.user,
            document=document,
            taxonomy=payload.taxonomy,
            categories=payload.categories,
            api_token=request.api_token,
        )

    return _created(request, response, idempotency_key, create)


@router.post("/draft", response=CREATE_RESPONSES, auth=auth.WRITE, summary="Draft a reply")
def create_draft(
    request,
    response: HttpResponse,
    payload: DraftIn,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", description=IDEMPOTENCY_HELP),
):
    """Queue a drafted reply (decode queue), grounded on passages of the chosen documents, of a
    group's documents, or (neither given) of every document you may read. Each sentence of the
    result is checked against the passages it cites."""

    def create():
        for document_id in payload.document_ids:
            readable_document(request, document_id, field="document_ids")
        return services.job_create_draft(
            owner=request.user,
            message=payload.message,
            document_ids=payload.document_ids,
            group_id=payload.group_id,
            tone=payload.tone,
            length=payload.length,
            api_token=request.api_token,
        )

    return _created(request, response, idempotency_key, create)


class JobFilters(Schema):
    state: JobState | None = None
    kind: Kind | None = None


@router.get("", response=responses(ok={200: JobPage}), auth=auth.READ, summary="List your jobs")
def list_jobs(
    request,
    filters: Query[JobFilters],
    page: int = Query(1, ge=1, le=MAX_PAGE),
    page_size: int = Query(50, ge=1, le=200),
):
    jobs = selectors.jobs_of(user=request.user)
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.kind:
        jobs = jobs.filter(kind=filters.kind)
    orders: dict = {}  # each queue's order, worked out once for the page
    readable: set[int] = set()  # the cited documents the reader may read, looked up once for the page

    def look_up(rows) -> None:
        readable.update(grounding.readable_ids(request.user, list(_cited_documents(rows))))

    return paginate(
        request,
        jobs,
        page=page,
        page_size=page_size,
        item=lambda job: job_out(request, job, orders=orders, readable=readable),
        prepare=look_up,
    )


@router.get("/{job_id}", response=responses(404, ok={200: JobOut}), auth=auth.READ, summary="A job")
def get_job(request, job_id: UUID):
    """State, place in the queue, result (with its checks and pages) and what the user felt:
    TTFT, tokens/s, tokens in and out."""
    return job_out(request, _own_job(request, job_id))


@router.post("/{job_id}/cancel", response=responses(404, 409, ok={200: JobOut}), auth=auth.WRITE, summary="Cancel")
def cancel_job(request, job_id: UUID):
    """Cancel a queued or running job; the engine stops writing it and frees its memory."""
    job = _own_job(request, job_id)
    if not services.job_cancel(job=job):
        job.refresh_from_db()
        if job.is_finished:
            raise ApiProblem(409, "conflict", f"The job is already {job.get_state_display().lower()}.")
    return job_out(request, _own_job(request, job_id))


@router.get(
    "/{job_id}/stream",
    response=responses(404),
    auth=auth.READ,
    summary="Stream a job (server-sent events)",
    openapi_extra={"responses": {200: {"description": "Server-sent events", "content": SSE_CONTENT}}},
)
async def stream_job(request, job_id: UUID, last_event_id: str | None = Header(None, alias="Last-Event-ID")):
    """`text/event-stream`: `queue` events ({position, eta_s}) while waiting, `delta` events
    ({text}) as the answer is written, then `done` (with TTFT, tokens/s and the note), `failed`
    or `cancelled` ({detail}). Reconnect with `Last-Event-ID` to get only what you missed."""
    if not events.valid_event_id(last_event_id):
        raise ApiProblem(
            400,
            "bad-request",
            "Last-Event-ID: not an event id this stream sent.",
            errors=[{"field": "Last-Event-ID", "message": "not an event id this stream sent"}],
        )
    job = await selectors.ajob_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise not_found("job")
    # 429 at the limit (api/site.py)
    slot = await streaming.take_stream_slot(request.user.pk, api_token=getattr(request, "api_token", None))
    return events.sse_response(
        streaming.held_stream(request.user.pk, slot, events.job_events(job, after=last_event_id or "0"))
    )
