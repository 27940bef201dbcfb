"""``/api/v1/documents`` and ``/api/v1/search``: the library over HTTP, with the UI's access rule.

A document the caller may not read answers 404, exactly like one that does not exist; only a
reader who is not the owner gets 403 for what only the owner may do (delete, share).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Literal

from django.conf import settings
from django.db import transaction
from ninja import File, Form, Query, Router, Schema, Status
from ninja.files import UploadedFile
from pydantic import Field

from api import auth
from api.pagination import MAX_PAGE, Paginated, paginate
from api.problems import ApiProblem, bad_field, responses
from console.services import audit
from documents import selectors, services
from documents.models import Document

router = Router()
search_router = Router()

OWNER_FILTERS = ("", "mine", "shared")
# Literals, not the model's choices: two enums named "State" would be one component of the schema.
# Written out so that a type checker reads them; tests/api/test_api_types.py keeps them equal
# to Document.State and Document.Kind.
DocumentState = Literal["uploaded", "extracting", "embedding", "ready", "failed", "cancelled"]
DocumentKind = Literal["pdf", "text", "markdown", "docx", "email", "unknown"]


class GroupOut(Schema):
    id: int
    name: str


class DocumentOut(Schema):
    id: int
    title: str
    filename: str
    kind: DocumentKind
    content_type: str
    size_bytes: int
    state: DocumentState
    failure_reason: str
    pages_total: int | None
    pages_done: int
    pages_needing_ocr: int
    owner: str
    is_owner: bool
    shared_with: list[GroupOut]
    parent_id: int | None
    source_id: int | None = Field(None, description="The source (watched folder, mailbox) it came from.")
    source_path: str = Field("", description="Where in its source: the file's path, or the folder and UID.")
    source_removed_at: datetime | None = Field(
        None, description="When its file was deleted from the source (or its message from the mailbox)."
    )
    replaced_by_id: int | None = Field(None, description="The newer version, when its source's file changed.")
    created_at: datetime
    updated_at: datetime


class PageOut(Schema):
    number: int
    text: str
    ocr: bool
    needs_ocr: bool


class DocumentDetail(DocumentOut):
    pages: list[PageOut]
    attachments: list[int] = Field(description="Ids of the documents attached to this e-mail that you may read.")


class DocumentPage(Paginated):
    results: list[DocumentOut]


class UploadOut(DocumentOut):
    created: bool = Field(description="False when you had uploaded the same bytes before: the existing document.")


class ShareIn(Schema):
    groups: list[int] = Field(description="Ids of your groups to share with; an empty list makes the document private.")


class PassageOut(Schema):
    document_id: int
    document_title: str
    page_start: int
    page_end: int
    text: str
    score: float


class SearchOut(Schema):
    query: str
    results: list[PassageOut]


def document_out(document: Document, user) -> dict:
    return {
        **{name: getattr(document, name) for name in DocumentOut.model_fields if hasattr(document, name)},
        "owner": document.owner.get_username(),
        "is_owner": document.owner_id == user.pk,
        "shared_with": [{"id": g.pk, "name": g.name} for g in document.shared_with.all()],
    }


def readable_document(request, document_id: int, *, field: str | None = None) -> Document:
    """The document, if the caller may read it; else 404, as for one that does not exist.
    ``field``: the request body's field that named it, for the problem's ``errors``."""
    document = selectors.document_for_user(user=request.user, document_id=document_id)
    if document is None:
        errors = [{"field": field, "message": "no such document"}] if field else None
        raise ApiProblem(404, "not-found", "No such document.", errors=errors)
    return document


class LibraryFilters(Schema):
    owner: str = Field("", description="`mine`, `shared`, or empty for both.")
    state: DocumentState | None = None
    kind: DocumentKind | None = None
    title: str = Field("", max_length=200, description="Part of the title or file name.")
    group: int | None = Field(None, description="Only documents shared with this group.")


@router.get("", response=responses(ok={200: DocumentPage}), auth=auth.READ, summary="List documents")
def list_documents(
    request,
    filters: Query[LibraryFilters],
    page: int = Query(1, ge=1, le=MAX_PAGE),
    page_size: int = Query(50, ge=1, le=200),
):
    """Top-level documents you may read (your own and those shared with your groups), newest
    first, with the library's filters."""
    if filters.owner not in OWNER_FILTERS:
        raise bad_field("owner", "must be mine, shared or empty")
    documents = selectors.library_for_user(
        user=request.user,
        owner=filters.owner,
        state=filters.state or "",
        kind=filters.kind or "",
        title=filters.title.strip(),
        group_id=filters.group,
    )
    return paginate(request, documents, page=page, page_size=page_size, item=lambda d: document_out(d, request.user))


@router.post(
    "",
    response=responses(413, 429, 503, ok={200: UploadOut, 201: UploadOut}),
    auth=auth.WRITE,
    summary="Upload a document",
)
def upload_document(request, file: File[UploadedFile], groups: Form[list[int]] = None):  # type: ignore[assignment]  # noqa: B008  (None: not shared)
    """Store a file (PDF, Word, text, Markdown, e-mail) and queue its ingestion; poll the
    document until `state` is `ready`. The same bytes uploaded again return the existing
    document with 200 and `created: false`."""
    if file.size is not None and file.size > services.max_upload_bytes():
        raise ApiProblem(
            413,
            "upload-too-large",
            f"{file.name} is {file.size / 1024 / 1024:.1f} MB; the upload limit is {settings.APPLIANCE_MAX_UPLOAD_MB} MB.",
        )
    mine = {g.pk: g for g in request.user.groups.all()}
    chosen = []
    for group_id in groups or []:
        if group_id not in mine:
            raise bad_field("groups", f"you are not a member of group {group_id}")
        chosen.append(mine[group_id])
    try:
        document, created = services.document_create(owner=request.user, upload=file, groups=chosen)
    except services.UploadRejected as exc:
        if exc.status != 400:
            raise  # a limit (413, 429): api/site.py answers with its status and Retry-After
        raise bad_field("file", str(exc)) from None
    if created:
        audit(request, "upload", target=document.title, document=document, filename=document.filename, api=True)
    return Status(201 if created else 200, {**document_out(document, request.user), "created": created})


@router.get("/{document_id}", response=responses(404, ok={200: DocumentDetail}), auth=auth.READ, summary="A document")
def get_document(request, document_id: int):
    """The document's state, sharing, and the text of each of its pages."""
    document = readable_document(request, document_id)
    audit(request, "read", target=document.title, document=document, api=True)
    attachments = selectors.documents_readable_by(request.user).filter(parent=document).values_list("pk", flat=True)
    return {
        **document_out(document, request.user),
        "pages": list(selectors.pages_of(document).values("number", "text", "ocr", "needs_ocr")),
        "attachments": list(attachments),
    }


@router.delete("/{document_id}", response=responses(403, 404, ok={204: None}), auth=auth.WRITE, summary="Delete")
def delete_document(request, document_id: int):
    """Delete a document you own, with its pages, passages and attachments. Drafts grounded on
    it keep their text."""
    document = readable_document(request, document_id)
    title = document.title
    services.document_delete(document=document, user=request.user)
    audit(request, "delete", target=title, api=True)
    return Status(204, None)


@router.post(
    "/{document_id}/cancel",
    response=responses(403, 404, 409, ok={200: DocumentOut}),
    auth=auth.WRITE,
    summary="Cancel reading a document",
)
def cancel_document(request, document_id: int):
    """Stop the ingestion of a document you own (and of its attachments): at once if it has not
    started, at the worker's next step if it is being read. Nothing of it becomes searchable;
    upload the same file again to read it later. 409 when it had already finished."""
    document = readable_document(request, document_id)
    if not services.document_cancel(document=document, user=request.user):
        raise ApiProblem(409, "conflict", f"The document is already {document.get_state_display().lower()}.")
    document.refresh_from_db()
    return document_out(document, request.user)


@router.put(
    "/{document_id}/sharing",
    response=responses(403, 404, ok={200: DocumentOut}),
    auth=auth.WRITE,
    summary="Share with groups",
)
def share_document(request, document_id: int, payload: ShareIn):
    """Share a document you own with exactly these groups of yours (its attachments follow)."""
    document = readable_document(request, document_id)
    groups = list(request.user.groups.filter(pk__in=payload.groups))
    others = sorted(set(payload.groups) - {g.pk for g in groups})
    if others:
        # The same answer whether such a group exists or not: it says nothing of groups one is not in.
        raise bad_field(
            "groups", f"{others[0]} is not one of your groups; you can share only with groups you belong to."
        )
    with transaction.atomic():
        services.document_share(document=document, user=request.user, groups=groups)
    document.refresh_from_db()
    audit(request, "share", target=document.title, document=document, groups=sorted(g.name for g in groups), api=True)
    return document_out(document, request.user)


@search_router.get("", response=responses(ok={200: SearchOut}), auth=auth.READ, summary="Search passages")
def search(
    request,
    q: str = Query(..., min_length=1, max_length=500, description="What to look for, in words."),
    document: list[int] = Query(None, description="Only these documents (repeat the parameter)."),  # noqa: B008
    limit: int = Query(10, ge=1, le=50),
):
    """The passages that best answer `q` among the documents you may read (hybrid: meaning and
    words), best first."""
    from documents.search import search_passages

    query = q.strip()
    if not query:
        raise bad_field("q", "must contain more than spaces")
    passages = search_passages(user=request.user, query=query, limit=limit, document_ids=document or None)
    return {"query": query, "results": [asdict(p) for p in passages]}
