"""Staff browser views for jobs: start a summary or a clause extraction, watch it stream,
cancel it, export clauses."""

from __future__ import annotations

import csv

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from documents import selectors as document_selectors
from inference import selectors, services, streaming
from inference.clauses import DEFAULT_TAXONOMY
from inference.models import JobKind

QUEUE_REPORT_MS = 2000  # how often a queued job's stream says where it stands
CONTEXT_CHARS = 240  # page text shown around a clause


@login_required
@require_POST
def summarise(request, document_id: int):
    return _start_document_job(
        request,
        document_id,
        lambda document: services.job_create_summary(
            owner=request.user,
            document=document,
            length=request.POST.get("length", "standard"),
            focus=request.POST.get("focus", ""),
        ),
    )


@login_required
@require_POST
def extract_clauses(request, document_id: int):
    return _start_document_job(
        request,
        document_id,
        lambda document: services.job_create_clauses(
            owner=request.user,
            document=document,
            taxonomy=request.POST.get("taxonomy", DEFAULT_TAXONOMY),
            categories=request.POST.getlist("categories"),
        ),
    )


def _start_document_job(request, document_id: int, create):
    """A job on a document the user may read: its page, or 429 when the queue is full, or the
    document's page with the reason it was refused."""
    document = document_selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        raise Http404("No such document.")
    try:
        job = create(document)
    except services.QueueFull as exc:
        return busy_response(request, exc)
    except services.JobRejected as exc:
        messages.error(request, str(exc))
        return redirect("documents:detail", document_id=document.pk)
    return redirect("inference:job", job_id=job.pk)


def busy_response(request, exc: services.QueueFull):
    """429 with Retry-After: the queue is full. The page says when to try again."""
    response = render(
        request, "inference/busy.html", {"message": str(exc), "retry_after_s": exc.retry_after_s}, status=429
    )
    response["Retry-After"] = str(exc.retry_after_s)
    return response


@login_required
def clauses_export(request, job_id, fmt: str):
    """The verified clauses of a finished extraction as CSV or JSON."""
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if (
        fmt not in {"csv", "json"}
        or job is None
        or job.kind != JobKind.EXTRACT_CLAUSES
        or job.state != job.State.SUCCEEDED
    ):
        raise Http404("No such clause extraction.")
    clauses = job.result_data.get("clauses", [])
    name = f"clauses-{slugify(job.document.title) or job.pk}"
    if fmt == "json":
        response = JsonResponse(
            {"document": job.document.title, "job": str(job.pk), **job.result_data}, json_dumps_params={"indent": 2}
        )
    else:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        writer = csv.writer(response)
        writer.writerow(["category", "page", "quote", "note", "match"])
        for clause in clauses:
            writer.writerow([_csv_cell(clause[k]) for k in ("category", "page", "quote", "note", "match")])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


def _csv_cell(value):
    """No spreadsheet formulas from a document's text (CSV injection)."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def clause_views(job) -> list[dict]:
    """Each clause with the text around it on its page, for highlighting (escaped by the template)."""
    if job.kind != JobKind.EXTRACT_CLAUSES or not job.result_data.get("clauses"):
        return []
    numbers = {c["page"] for c in job.result_data["clauses"]}
    texts = dict(job.document.pages.filter(number__in=numbers).values_list("number", "text"))
    views = []
    for clause in job.result_data["clauses"]:
        text = texts.get(clause["page"], "")
        start, end = clause["start"], clause["end"]
        views.append(
            {
                **clause,
                "before": ("\u2026" if start > CONTEXT_CHARS else "") + text[max(0, start - CONTEXT_CHARS) : start],
                "match_text": text[start:end],
                "after": text[end : end + CONTEXT_CHARS] + ("\u2026" if end + CONTEXT_CHARS < len(text) else ""),
            }
        )
    return views


@login_required
def job_detail(request, job_id):
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    return render(
        request,
        "inference/job.html",
        {
            "job": job,
            "metrics": getattr(job, "metrics", None),
            "queue": selectors.job_queue_status(job),
            "clauses": clause_views(job),
        },
    )


@login_required
@require_POST
def job_cancel(request, job_id):
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    if services.job_cancel(job=job):
        messages.info(request, "The job was cancelled.")
    return redirect("inference:job", job_id=job.pk)


@login_required
async def job_events(request, job_id):
    """Server-sent events for one job: ``delta`` text, then ``done``, ``failed`` or ``cancelled``.
    A reconnecting browser sends ``Last-Event-ID`` and gets only what it has not seen."""
    user = await request.auser()
    job = await selectors.ajob_for_user(user=user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    after = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"

    async def events():
        yield "retry: 2000\n\n"
        if job.is_finished and not await streaming.stream_exists(job.pk):
            # The live stream has expired; what was stored is the whole answer.
            yield streaming.format_sse("snapshot", {"text": job.result_text})
            yield streaming.format_sse(job_final_event(job), {"detail": job.error, "note": job.result_note})
            return
        started = job.state != job.State.QUEUED
        async for event_id, event, data in streaming.read_events(job.pk, after=after, block_ms=QUEUE_REPORT_MS):
            if event == "keepalive":
                status = None if started else await selectors.ajob_queue_status(job_id=job.pk)
                if status and status["state"] == job.State.QUEUED:
                    yield streaming.format_sse("queue", {"position": status["position"], "eta_s": status["eta_s"]})
                else:
                    started = True
                    yield ": keepalive\n\n"
            else:
                yield streaming.format_sse(event, data, event_id)

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def job_final_event(job) -> str:
    return {"succeeded": "done", "failed": "failed", "cancelled": "cancelled"}[job.state]
