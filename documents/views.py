"""Staff browser views for documents. They call services and selectors, nothing else."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from api import ratelimit
from appliance.broker import BrokerUnavailable
from console.services import audit
from documents import batch_services, selectors, services
from documents.models import Document
from inference.clauses import TAXONOMIES
from inference.models import Job
from inference.prompts import SUMMARY_LENGTHS

ACCEPTED_FILES = (
    ".pdf,.docx,.txt,.md,.markdown,.eml,.zip,application/pdf,text/plain,text/markdown,message/rfc822,application/zip"
)


def _document_or_404(request, document_id: int) -> Document:
    document = selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        raise Http404("No such document.")
    return document


def _my_groups_named(request, field: str = "groups") -> list:
    """The groups named in the POST that the user belongs to (others are ignored)."""
    mine = {group.pk: group for group in request.user.groups.all()}
    return [mine[pk] for pk in map(_int_or_none, request.POST.getlist(field)) if pk in mine]


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@login_required
@require_http_methods(["GET", "POST"])
def library(request):
    if request.method == "POST":
        uploads = request.FILES.getlist("files")
        if not uploads:
            messages.error(request, "Choose at least one file to upload.")
        groups = _my_groups_named(request)
        if len(uploads) > 1 or any(batch_services.is_archive(upload) for upload in uploads):
            return _upload_batch(request, uploads, groups)
        for upload in uploads:
            try:
                document, created = services.document_create(owner=request.user, upload=upload, groups=groups)
            except services.UploadRejected as exc:
                messages.error(request, str(exc))
                continue
            except BrokerUnavailable as exc:  # the rest would fail the same way
                messages.error(request, f"{upload.name} and any files after it were not uploaded. {exc}")
                break
            if created:
                audit(request, "upload", target=document.title, document=document, filename=document.filename)
                messages.success(request, f"{document.filename} uploaded; its text is being extracted.")
            else:
                messages.info(request, f"{upload.name} is already in your library as “{document.title}”.")
        return redirect("documents:library")
    filters = {
        "owner": request.GET.get("owner", ""),
        "state": request.GET.get("state", ""),
        "kind": request.GET.get("kind", ""),
        "title": request.GET.get("title", "").strip(),
        "group_id": _int_or_none(request.GET.get("group")),
    }
    documents = selectors.library_for_user(user=request.user, **filters)
    return render(
        request,
        "documents/library.html",
        {
            "documents": documents,
            "filters": filters,
            "states": Document.State.choices,
            "kinds": Document.Kind.choices,
            "groups": request.user.groups.order_by("name"),
            "accepted_files": ACCEPTED_FILES,
        },
    )


BATCH_MESSAGES_PER_FILE = 10


def _upload_batch(request, uploads: list, groups: list):
    """Several files, or a zip: a batch, followed on its own page."""
    try:
        batch, created = batch_services.batch_create(owner=request.user, uploads=uploads, groups=groups)
    except services.UploadRejected as exc:
        messages.error(request, str(exc))
        return redirect("documents:library")
    except BrokerUnavailable as exc:
        messages.error(request, f"Nothing was uploaded. {exc}")
        return redirect("documents:library")
    for document in created:
        audit(request, "upload", target=document.title, document=document, filename=document.filename, batch=batch.pk)
    if len(created) <= BATCH_MESSAGES_PER_FILE:  # as a single upload says it; a big batch says it once
        for document in created:
            messages.success(request, f"{document.filename} uploaded; its text is being extracted.")
    else:
        messages.success(request, f"{len(created)} files uploaded; their text is being extracted.")
    if batch.files_skipped:
        messages.warning(request, f"{batch.files_skipped} file(s) skipped: the reasons are listed below.")
    return redirect("documents:batch", batch_id=batch.pk)


def _batch_or_404(request, batch_id: int):
    batch = selectors.batch_for_user(user=request.user, batch_id=batch_id)
    if batch is None:
        raise Http404("No such batch.")
    return batch


@login_required
def batches(request):
    mine = list(selectors.batches_of(request.user)[:100])
    return render(
        request,
        "documents/batches.html",
        {"batches": [(batch, selectors.batch_status(batch)) for batch in mine]},
    )


def _batch_context(batch) -> dict:
    status = selectors.batch_status(batch)
    return {
        "batch": batch,
        "status": status,
        "documents": selectors.batch_documents(batch),
        "live": not status.finished,
    }


@login_required
def batch(request, batch_id: int):
    """A batch's page: files done and failed (with why), pages per second, ETA, Cancel."""
    return render(request, "documents/batch.html", _batch_context(_batch_or_404(request, batch_id)))


@login_required
def batch_progress(request, batch_id: int):
    """The page's progress part, fetched again every 2 s (htmx) while the batch runs."""
    return render(request, "documents/_batch_progress.html", _batch_context(_batch_or_404(request, batch_id)))


@login_required
@require_POST
def batch_cancel(request, batch_id: int):
    batch = _batch_or_404(request, batch_id)
    if batch_services.batch_cancel(batch=batch, user=request.user):
        messages.success(request, "Batch cancelled: files not read yet will not be; what was read stays.")
    else:
        messages.info(request, "The batch had already finished.")
    return redirect("documents:batch", batch_id=batch.pk)


@login_required
@require_POST
def cancel(request, document_id: int):
    """Stop reading a document (owner only): nothing of it becomes searchable."""
    document = _document_or_404(request, document_id)
    try:
        cancelled = services.document_cancel(document=document, user=request.user)
    except services.NotAllowed as exc:
        messages.error(request, str(exc))
    else:
        if cancelled:
            messages.success(request, f"Reading “{document.title}” was cancelled.")
        else:
            messages.info(request, f"“{document.title}” had already finished.")
    return redirect("documents:detail", document_id=document.pk)


@login_required
def detail(request, document_id: int):
    document = _document_or_404(request, document_id)
    audit(request, "read", target=document.title, document=document)
    pages = selectors.pages_of(document)
    jobs = Job.objects.filter(document=document, owner=request.user).select_related("metrics")[:20]
    return render(
        request,
        "documents/detail.html",
        {
            "document": document,
            "pages": pages,
            "jobs": jobs,
            "children": selectors.documents_readable_by(request.user).filter(parent=document),
            "versions": selectors.versions_of(user=request.user, document=document),
            "summary_lengths": list(SUMMARY_LENGTHS),
            "clause_categories": TAXONOMIES["cuad"],
            "is_owner": document.owner_id == request.user.pk,
            "groups": request.user.groups.order_by("name"),
            "shared_ids": set(document.shared_with.values_list("pk", flat=True)),
            "query": request.GET.get("q", "")[:500],
        },
    )


@login_required
def status(request, document_id: int):
    """The document's state, for the page to poll while it is processed."""
    document = _document_or_404(request, document_id)
    return JsonResponse(
        {
            "id": document.pk,
            "state": document.state,
            "state_label": document.get_state_display(),
            "failure_reason": document.failure_reason,
            "pages_done": document.pages_done,
            "pages_total": document.pages_total,
            "pages_needing_ocr": document.pages_needing_ocr,
            "finished": document.is_finished,
        }
    )


@login_required
@require_POST
def share(request, document_id: int):
    document = _document_or_404(request, document_id)
    try:
        services.document_share(document=document, user=request.user, groups=_my_groups_named(request))
    except services.NotAllowed as exc:
        messages.error(request, str(exc))
    else:
        shared = sorted(document.shared_with.values_list("name", flat=True))
        audit(request, "share", target=document.title, document=document, groups=shared)
        messages.success(request, "Sharing updated.")
    return redirect("documents:detail", document_id=document.pk)


@login_required
@require_POST
def delete(request, document_id: int):
    document = _document_or_404(request, document_id)
    title = document.title
    try:
        services.document_delete(document=document, user=request.user)
    except services.NotAllowed as exc:
        messages.error(request, str(exc))
        return redirect("documents:detail", document_id=document.pk)
    audit(request, "delete", target=title)
    messages.success(request, f"“{title}” was deleted.")
    return redirect("documents:library")


@login_required
def download(request, document_id: int):
    document = _document_or_404(request, document_id)
    audit(request, "download", target=document.title, document=document, filename=document.filename)
    return FileResponse(document.file.open("rb"), as_attachment=True, filename=document.filename)


@login_required
def search(request):
    from documents.search import search_passages

    query = request.GET.get("q", "").strip()[:500]
    if query and (retry_after_s := ratelimit.hit_session(request.user.pk)) is not None:
        # Each search embeds the query and scans the index: counted with the API calls the
        # person's session signs (``APPLIANCE_SESSION_API_RATE_LIMIT_PER_MINUTE``), so a script
        # with a session cookie cannot search here without the limit it has at /api/v1/search.
        limited = (
            f"You may search or call the API {ratelimit.session_limit()} times a minute; "
            f"try again in {retry_after_s} s."
        )
        response = render(request, "documents/search.html", {"query": query, "limited": limited}, status=429)
        response["Retry-After"] = str(retry_after_s)
        return response
    passages = search_passages(user=request.user, query=query, limit=20) if query else []
    return render(request, "documents/search.html", {"query": query, "passages": passages})
