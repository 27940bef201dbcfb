"""Staff browser views for jobs: start a summary, watch it stream, cancel it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from documents import selectors as document_selectors
from inference import selectors, services, streaming

QUEUE_REPORT_MS = 2000  # how often a queued job's stream says where it stands


@login_required
@require_POST
def summarise(request, document_id: int):
    document = document_selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        raise Http404("No such document.")
    try:
        job = services.job_create_summary(
            owner=request.user,
            document=document,
            length=request.POST.get("length", "standard"),
            focus=request.POST.get("focus", ""),
        )
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
def job_detail(request, job_id):
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    return render(
        request,
        "inference/job.html",
        {"job": job, "metrics": getattr(job, "metrics", None), "queue": selectors.job_queue_status(job)},
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
