"""Staff browser views for jobs: start a summary, a clause extraction or a drafted reply, watch
it stream, cancel it, export clauses, edit and regenerate a draft."""

from __future__ import annotations

import csv

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods, require_POST

from console.services import audit
from documents import selectors as document_selectors
from documents.search import readable_documents
from documents.services import UploadRejected, text_of_message_upload
from inference import events, exports, grounding, selectors, services, streaming
from inference.clauses import DEFAULT_TAXONOMY
from inference.drafting import MESSAGE_MAX_CHARS, sentence_parts
from inference.job_results import ClauseResult, DraftResult, SummaryResult, clause_to_json, sentence_to_json
from inference.models import JobKind
from inference.prompts import DEFAULT_DRAFT_LENGTH, DEFAULT_DRAFT_TONE, DRAFT_LENGTHS, DRAFT_TONES

CONTEXT_CHARS = 240  # page text shown around a clause
DRAFT_DOCUMENT_CHOICES = 500  # the most recent documents offered to ground a reply on


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


@login_required
@require_http_methods(["GET", "POST"])
def draft_new(request):
    """The drafting form: the message (pasted or uploaded), the documents or group to ground the
    reply on, tone and length. POST starts the job."""
    values = {
        "message": "",
        "document_ids": [_int(v) for v in request.GET.getlist("document") if _int(v)],
        "group_id": None,
        "tone": DEFAULT_DRAFT_TONE,
        "length": DEFAULT_DRAFT_LENGTH,
    }
    reply_to = _int(request.GET.get("reply_to")) if request.method == "GET" else None
    if reply_to:
        # An e-mail in the library (a mailbox source's): the message is its text, and the
        # reply is grounded on its attachments unless other documents are chosen.
        message, attachments = document_selectors.reply_context(user=request.user, document_id=reply_to)
        values["message"] = message[:MESSAGE_MAX_CHARS]
        values["document_ids"] = values["document_ids"] or attachments
    status, retry_after_s = 200, 0
    if request.method == "POST":
        values = {
            "message": request.POST.get("message", ""),
            "document_ids": [_int(v) for v in request.POST.getlist("documents") if _int(v)],
            "group_id": _int(request.POST.get("group")),
            "tone": request.POST.get("tone", DEFAULT_DRAFT_TONE),
            "length": request.POST.get("length", DEFAULT_DRAFT_LENGTH),
        }
        try:
            upload = request.FILES.get("message_file")
            if upload is not None and not values["message"].strip():
                values["message"] = text_of_message_upload(upload, owner_id=request.user.pk)
            job = services.job_create_draft(owner=request.user, **values)
        except (services.QueueFull, services.BrokerUnavailable) as exc:
            return busy_response(request, exc)
        except UploadRejected as exc:
            messages.error(request, str(exc))
            status, retry_after_s = exc.status, exc.retry_after_s  # 429: another of theirs is being read
        except services.JobRejected as exc:
            messages.error(request, str(exc))
            status = 400
        else:
            return redirect("inference:job", job_id=job.pk)
    # Top-level documents, and whichever were chosen (an attachment's "draft a reply" link).
    documents = readable_documents(request.user, ready_only=True).filter(
        Q(parent=None) | Q(pk__in=values["document_ids"])
    )
    response = render(
        request,
        "inference/draft_new.html",
        {
            "values": values,
            "documents": documents.only("pk", "title")[:DRAFT_DOCUMENT_CHOICES],
            "groups": request.user.groups.order_by("name"),
            "tones": list(DRAFT_TONES),
            "lengths": list(DRAFT_LENGTHS),
            "message_max_chars": MESSAGE_MAX_CHARS,
        },
        status=status,
    )
    if retry_after_s:
        response["Retry-After"] = str(retry_after_s)
    return response


def _int(value) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


@login_required
@require_POST
def draft_regenerate(request, job_id):
    job = _draft_or_404(request, job_id)
    tone, length = request.POST.get("tone"), request.POST.get("length")
    return _start_from(
        request, job, lambda: services.job_regenerate_draft(job=job, user=request.user, tone=tone, length=length)
    )


def _start_from(request, job, create):
    """A new job made from ``job`` (regenerated, retried): its page; 429 when the queue is full;
    or back to ``job``'s page with the reason it was refused."""
    try:
        new = create()
    except (services.QueueFull, services.BrokerUnavailable) as exc:
        return busy_response(request, exc)
    except services.JobRejected as exc:
        messages.error(request, str(exc))
        return redirect("inference:job", job_id=job.pk)
    return redirect("inference:job", job_id=new.pk)


@login_required
@require_POST
def draft_edit(request, job_id):
    job = _draft_or_404(request, job_id)
    try:
        services.draft_edit(job=job, text=request.POST.get("text", ""))
    except services.JobRejected as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Your edits are saved; they are being checked against the passages.")
    return redirect("inference:job", job_id=job.pk)


EDIT_CHECK_PATIENCE_S = 120  # the page stops reloading itself for an edit's check after this


def _older_than(iso: str | None, seconds: float) -> bool:
    from datetime import datetime

    from django.utils import timezone

    if not iso:
        return False
    return (timezone.now() - datetime.fromisoformat(iso)).total_seconds() > seconds


def _job_or_404(request, job_id):
    """One of the user's own jobs; 404 for anyone else's, as for one that does not exist."""
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    return job


def _draft_or_404(request, job_id):
    job = _job_or_404(request, job_id)
    if job.kind != JobKind.DRAFT:
        raise Http404("No such draft.")
    return job


def draft_view(job, user) -> dict | None:
    """A finished draft for its page: each sentence split into text and citations, flagged when
    its citations do not support it; each passage with whether the viewer may still open it."""
    if job.kind != JobKind.DRAFT or job.state != job.State.SUCCEEDED:
        return None
    draft = DraftResult.from_json(job.result_data)
    edited = draft.edited_text
    sentences = draft.current_sentences
    readable = grounding.readable_ids(user, [p.document_id for p in draft.passages])
    return {
        "text": edited or job.result_text,
        "edited": bool(edited),
        "checking": bool(edited) and sentences is None,
        "check_late": bool(edited) and sentences is None and _older_than(draft.edited_at, EDIT_CHECK_PATIENCE_S),
        "support": draft.current_support,
        "sentences": [
            {**sentence_to_json(sentence), "parts": sentence_parts(sentence.text), "uncited": not sentence.citations}
            for sentence in (sentences or ())
        ],
        "passages": [{**p.to_json(), "readable": p.document_id in readable} for p in draft.passages],
        "numbers": {p.number for p in draft.passages},
        "message": draft.message or job.options.get("message", ""),
        "scope": draft.scope,
        "tones": list(DRAFT_TONES),
        "lengths": list(DRAFT_LENGTHS),
    }


def _start_document_job(request, document_id: int, create):
    """A job on a document the user may read: its page, or 429 when the queue is full, or the
    document's page with the reason it was refused."""
    document = document_selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        raise Http404("No such document.")
    try:
        job = create(document)
    except (services.QueueFull, services.BrokerUnavailable) as exc:
        return busy_response(request, exc)
    except services.JobRejected as exc:
        messages.error(request, str(exc))
        return redirect("documents:detail", document_id=document.pk)
    return redirect("inference:job", job_id=job.pk)


def busy_response(request, exc: services.QueueFull | services.BrokerUnavailable):
    """429 when the queue (or the person's share of it) is full, 503 when the broker does not
    answer, both with Retry-After. The page says what happened and when to try again."""
    full = isinstance(exc, services.QueueFull)
    context = {
        "heading": "The appliance is busy" if full else "The job could not be queued",
        "message": str(exc),
        "retry_after_s": exc.retry_after_s,
    }
    response = render(request, "inference/busy.html", context, status=429 if full else 503)
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
        or job.document is None  # an extraction is always of a document
    ):
        raise Http404("No such clause extraction.")
    result = ClauseResult.from_json(job.result_data)
    title = job.document.title
    name = f"clauses-{slugify(title) or job.pk}"
    audit(request, "export", target=f"Clauses of {title} ({fmt})", document=job.document, job=job)
    response: HttpResponse
    if fmt == "json":
        response = JsonResponse(
            {"document": title, "job": str(job.pk), **result.to_json()}, json_dumps_params={"indent": 2}
        )
    else:
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        writer = csv.writer(response)
        writer.writerow(["category", "page", "end_page", "quote", "note", "match"])
        for c in result.clauses:
            writer.writerow([_csv_cell(v) for v in (c.category, c.page, c.end_page, c.quote, c.note, c.match)])
    response["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return response


@login_required
def job_export(request, job_id, fmt: str):
    """A finished job as Markdown, or a drafted reply or summary as a Word document."""
    job = selectors.job_for_user(user=request.user, job_id=job_id)
    if job is None or job.state != job.State.SUCCEEDED or fmt not in {"md", "docx"}:
        raise Http404("No such result.")
    if fmt == "docx" and job.kind not in exports.DOCX_KINDS:
        raise Http404("Only drafted replies and summaries export as Word documents.")
    title = job.document.title if job.document is not None else ""
    stem = slugify(f"{job.get_kind_display()} {title}") or str(job.pk)
    on = f" of {title}" if title else ""
    audit(request, "export", target=f"{job.get_kind_display()}{on} ({fmt})", document=job.document, job=job)
    passages = DraftResult.from_json(job.result_data).passages if job.kind == JobKind.DRAFT else ()
    readable = grounding.readable_ids(request.user, [p.document_id for p in passages])
    if fmt == "md":
        response = HttpResponse(exports.as_markdown(job, readable), content_type="text/markdown; charset=utf-8")
    else:
        response = HttpResponse(exports.as_docx(job, readable), content_type=exports.DOCX_CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="{stem}.{fmt}"'
    return response


def _csv_cell(value):
    """No spreadsheet formulas from a document's text (CSV injection)."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def clause_views(job) -> list[dict]:
    """Each clause with the text around it on its page, for highlighting (escaped by the template)."""
    if job.kind != JobKind.EXTRACT_CLAUSES:
        return []
    clauses = ClauseResult.from_json(job.result_data).clauses
    if not clauses:
        return []
    numbers = {c.page for c in clauses}
    texts = dict(job.document.pages.filter(number__in=numbers).values_list("number", "text"))
    views = []
    for clause in clauses:
        text = texts.get(clause.page, "")
        start, end = clause.start, clause.end
        if clause.end_page != clause.page:
            end = len(text)  # it goes on over the page break: its first page's part is marked
        views.append(
            {
                **clause_to_json(clause),
                "before": ("\u2026" if start > CONTEXT_CHARS else "") + text[max(0, start - CONTEXT_CHARS) : start],
                "match_text": text[start:end],
                "after": text[end : end + CONTEXT_CHARS] + ("\u2026" if end + CONTEXT_CHARS < len(text) else ""),
            }
        )
    return views


@login_required
def job_detail(request, job_id):
    job = _job_or_404(request, job_id)
    return render(
        request,
        "inference/job.html",
        {
            "job": job,
            "metrics": getattr(job, "metrics", None),
            "queue": selectors.job_queue_status(job),
            "clauses": clause_views(job),
            "draft": draft_view(job, request.user),
            "summary": SummaryResult.from_json(job.result_data) if job.kind == JobKind.SUMMARISE else None,
        },
    )


JOBS_LISTED = 100


@login_required
def job_list(request):
    """The user's jobs, newest first, with where each queued one stands. While any is unfinished,
    htmx fetches the rows again every 2 s (``job_rows``); without JavaScript, a refresh does."""
    return render(request, "inference/jobs.html", _job_rows_context(request))


@login_required
def job_rows(request):
    return render(request, "inference/_job_rows.html", _job_rows_context(request))


def _job_rows_context(request) -> dict:
    jobs = list(selectors.jobs_of(user=request.user)[:JOBS_LISTED])
    orders: dict = {}  # each queue's order, worked out once for the page
    rows = [
        {"job": job, **(selectors.job_queue_status(job, orders=orders) if job.state == job.State.QUEUED else {})}
        for job in jobs
    ]
    return {"rows": rows, "live": any(not job.is_finished for job in jobs)}


@login_required
@require_POST
def job_retry(request, job_id):
    job = _job_or_404(request, job_id)
    return _start_from(request, job, lambda: services.job_retry(job=job, user=request.user))


@login_required
@require_POST
def job_cancel(request, job_id):
    job = _job_or_404(request, job_id)
    if services.job_cancel(job=job):
        messages.info(request, "The job was cancelled.")
    return redirect("inference:job", job_id=job.pk)


@login_required
async def job_events(request, job_id):
    """Server-sent events for one job (``inference.events``). A reconnecting browser sends
    ``Last-Event-ID`` and gets only what it has not seen."""
    user = await request.auser()
    job = await selectors.ajob_for_user(user=user, job_id=job_id)
    if job is None:
        raise Http404("No such job.")
    after = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    try:
        slot = await streaming.take_stream_slot(user.pk)
    except streaming.TooManyStreams as exc:
        return HttpResponse(str(exc), status=429, content_type="text/plain; charset=utf-8",
                            headers={"Retry-After": "30"})  # fmt: skip
    return events.sse_response(streaming.held_stream(user.pk, slot, events.job_events(job, after=after)))
