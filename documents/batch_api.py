"""``/api/v1/batches``: upload several files or a zip of a folder as one batch, follow it (its
files' states, pages per second, ETA; also as server-sent events) and cancel it.

A batch is its uploader's alone: anyone else's answers 404, exactly like one that does not
exist (its documents follow the library's rule: shared with your groups, you read them there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import datetime
from typing import Literal

from asgiref.sync import sync_to_async
from ninja import File, Form, Query, Router, Schema, Status
from ninja.files import UploadedFile
from pydantic import Field

from api import auth
from api.pagination import MAX_PAGE, Paginated, paginate
from api.problems import ApiProblem, bad_field, not_found, responses
from console.services import audit
from documents import batch_services, selectors
from documents.api import DocumentState
from documents.models import Batch

router = Router()

# Written out for the type checker (tests/documents/test_batches_api.py keeps it equal to Batch.State).
BatchState = Literal["running", "finished", "cancelled"]
PROGRESS_EVERY_S = 2.0
SSE_CONTENT = {"text/event-stream": {"schema": {"type": "string"}}}


class BatchProgressOut(Schema):
    files_total: int = Field(description="Files found: those that became documents, and those skipped.")
    files_done: int
    files_failed: int
    files_cancelled: int
    files_waiting: int = Field(description="Not started yet.")
    files_reading: int = Field(description="Being extracted or embedded now.")
    files_skipped: int
    pages_done: int
    elapsed_s: float
    pages_per_s: float | None = Field(description="Measured over the batch so far; null until a page is read.")
    eta_s: float | None = Field(description="Seconds left at the measured rate; null while it cannot be told.")
    finished: bool


class BatchFileOut(Schema):
    id: int = Field(description="The document's id (`/api/v1/documents/{id}`).")
    filename: str
    title: str
    state: DocumentState
    pages_total: int | None
    pages_done: int
    failure_reason: str = Field(description="Why it failed, in words a person understands.")


class SkippedOut(Schema):
    name: str = Field(description="The file's name, or its path inside the zip.")
    reason: str
    document_id: int | None = Field(None, description="The document it already is, when it was in your library.")


class BatchOut(Schema):
    id: int
    name: str
    state: BatchState
    created_at: datetime
    finished_at: datetime | None
    progress: BatchProgressOut


class BatchDetail(BatchOut):
    files: list[BatchFileOut]
    skipped: list[SkippedOut]


class BatchPage(Paginated):
    results: list[BatchOut]


def batch_out(batch: Batch) -> dict:
    return {
        "id": batch.pk,
        "name": batch.name,
        "state": batch.state,
        "created_at": batch.created_at,
        "finished_at": batch.finished_at,
        "progress": asdict(selectors.batch_status(batch)),
    }


def batch_detail(batch: Batch) -> dict:
    files = selectors.batch_documents(batch).values(
        "id", "filename", "title", "state", "pages_total", "pages_done", "failure_reason"
    )
    return {**batch_out(batch), "files": list(files), "skipped": batch.skipped}


def _own_batch(request, batch_id: int) -> Batch:
    batch = selectors.batch_for_user(user=request.user, batch_id=batch_id)
    if batch is None:
        raise not_found("batch")
    return batch


@router.post(
    "",
    response=responses(413, 429, 503, ok={201: BatchDetail}),
    auth=auth.WRITE,
    summary="Upload a batch (several files, or a zip of a folder)",
)
def create_batch(request, files: File[list[UploadedFile]], groups: Form[list[int]] = None):  # type: ignore[assignment]  # noqa: B008  (None: not shared)
    """Store each file (PDF, Word, text, Markdown, e-mail; a `.zip` is unpacked, safely) as a
    document of one batch and queue them. Each file is held to the upload limits of a single
    upload; what is not taken (unsupported, unsafe, nested archive, over a limit, already in your
    library) is listed in `skipped` with the reason. Follow it with `GET /api/v1/batches/{id}` or
    its `stream`."""
    mine = {g.pk: g for g in request.user.groups.all()}
    chosen = []
    for group_id in groups or []:
        if group_id not in mine:
            raise bad_field("groups", f"you are not a member of group {group_id}")
        chosen.append(mine[group_id])
    if not files:
        raise bad_field("files", "send at least one file")
    batch, created = batch_services.batch_create(owner=request.user, uploads=files, groups=chosen)
    for document in created:
        audit(
            request,
            "upload",
            target=document.title,
            document=document,
            filename=document.filename,
            batch=batch.pk,
            api=True,
        )
    return Status(201, batch_detail(batch))


@router.get("", response=responses(ok={200: BatchPage}), auth=auth.READ, summary="List your batches")
def list_batches(request, page: int = Query(1, ge=1, le=MAX_PAGE), page_size: int = Query(50, ge=1, le=200)):
    """Your batches, newest first, each with its progress."""
    return paginate(request, selectors.batches_of(request.user), page=page, page_size=page_size, item=batch_out)


@router.get("/{batch_id}", response=responses(404, ok={200: BatchDetail}), auth=auth.READ, summary="A batch")
def get_batch(request, batch_id: int):
    """The batch's progress (files done, failed, waiting; pages per second; ETA), each file's
    state with the reason it failed, and the files skipped with why."""
    return batch_detail(_own_batch(request, batch_id))


@router.post(
    "/{batch_id}/cancel", response=responses(404, 409, ok={200: BatchDetail}), auth=auth.WRITE, summary="Cancel"
)
def cancel_batch(request, batch_id: int):
    """Stop the batch: files not started are not read, a file being read stops at its worker's
    next check (nothing of it searchable), files done stay. 409 when it had finished."""
    batch = _own_batch(request, batch_id)
    if not batch_services.batch_cancel(batch=batch, user=request.user):
        raise ApiProblem(409, "conflict", f"The batch is already {batch.get_state_display().lower()}.")
    return batch_detail(_own_batch(request, batch_id))


async def batch_events(batch_id: int, *, every_s: float = PROGRESS_EVERY_S) -> AsyncIterator[str]:
    """``progress`` events (the batch's progress) when it changes, and at least every 15 s; then
    one ``done`` or ``cancelled`` with the final progress."""
    from inference.streaming import format_sse

    yield "retry: 2000\n\n"
    last: dict | None = None
    quiet_s = 0.0
    while True:
        batch = await Batch.objects.filter(pk=batch_id).afirst()
        if batch is None:
            yield format_sse("failed", {"detail": "The batch is gone."})
            return
        progress = asdict(await sync_to_async(selectors.batch_status)(batch))
        changed = {k: v for k, v in progress.items() if k != "elapsed_s"} != (
            {k: v for k, v in last.items() if k != "elapsed_s"} if last else None
        )
        if progress["finished"]:
            final = "cancelled" if batch.state == Batch.State.CANCELLED else "done"
            yield format_sse(final, {"state": batch.state, **progress})
            return
        if changed or quiet_s >= 15:
            yield format_sse("progress", {"state": batch.state, **progress})
            last, quiet_s = progress, 0.0
        await asyncio.sleep(every_s)
        quiet_s += every_s


@router.get(
    "/{batch_id}/stream",
    response=responses(404),
    auth=auth.READ,
    summary="Follow a batch (server-sent events)",
    openapi_extra={"responses": {200: {"description": "Server-sent events", "content": SSE_CONTENT}}},
)
async def stream_batch(request, batch_id: int):
    """`text/event-stream`: `progress` events (files done, failed, waiting, being read; pages
    read, pages per second, `eta_s`) as the batch moves, then `done` or `cancelled` with the final
    counts."""
    from inference import events, streaming

    batch = await sync_to_async(selectors.batch_for_user)(user=request.user, batch_id=batch_id)
    if batch is None:
        raise not_found("batch")
    slot = await streaming.take_stream_slot(request.user.pk, api_token=getattr(request, "api_token", None))
    return events.sse_response(streaming.held_stream(request.user.pk, slot, batch_events(batch.pk)))
