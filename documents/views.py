"""Staff browser views for documents. They call services and selectors, nothing else."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from documents import selectors, services
from documents.models import Document
from inference.models import Job
from inference.prompts import SUMMARY_LENGTHS


def _document_or_404(request, document_id: int) -> Document:
    document = selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        raise Http404("No such document.")
    return document


@login_required
@require_http_methods(["GET", "POST"])
def library(request):
    if request.method == "POST":
        uploads = request.FILES.getlist("files")
        if not uploads:
            messages.error(request, "Choose at least one file to upload.")
        for upload in uploads:
            try:
                document, created = services.document_create(owner=request.user, upload=upload)
            except services.UploadRejected as exc:
                messages.error(request, str(exc))
                continue
            if created:
                messages.success(request, f"{document.filename} uploaded; its text is being extracted.")
            else:
                messages.info(request, f"{upload.name} is already in your library as “{document.title}”.")
        return redirect("documents:library")
    documents = selectors.documents_readable_by(request.user)
    return render(request, "documents/library.html", {"documents": documents})


@login_required
def detail(request, document_id: int):
    document = _document_or_404(request, document_id)
    pages = selectors.pages_of(document)
    jobs = Job.objects.filter(document=document, owner=request.user).select_related("metrics")[:20]
    return render(
        request,
        "documents/detail.html",
        {"document": document, "pages": pages, "jobs": jobs, "summary_lengths": list(SUMMARY_LENGTHS)},
    )


@login_required
def status(request, document_id: int):
    """The document's state, for the page to poll while text is extracted."""
    document = _document_or_404(request, document_id)
    return JsonResponse(
        {
            "id": document.pk,
            "state": document.state,
            "state_label": document.get_state_display(),
            "failure_reason": document.failure_reason,
            "pages_done": document.pages_done,
            "pages_total": document.pages_total,
            "finished": document.is_finished,
        }
    )


@login_required
@require_POST
def delete(request, document_id: int):
    document = _document_or_404(request, document_id)
    title = document.title
    services.document_delete(document=document)
    messages.success(request, f"“{title}” was deleted.")
    return redirect("documents:library")


@login_required
def download(request, document_id: int):
    document = _document_or_404(request, document_id)
    return FileResponse(document.file.open("rb"), as_attachment=True, filename=document.filename)
