"""Reads for documents, always filtered by who may read them in the query itself.

A user may read a document they own, or one shared with a group they belong to (an e-mail's
attachments follow their e-mail's sharing, since they are shared with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from documents.batch_progress import Sample, batch_rate, format_duration, pages_of_unopened
from documents.models import UNFINISHED_STATES, Batch, Document, Page, Source


def readable_filter(user: User, *, document_field: str = "pk", owner_field: str = "owner") -> Q:
    """The condition "``user`` may read this document", in SQL. For a model that points at a
    document (a chunk, a job), pass ``document_field="document_id", owner_field="document__owner"``."""
    shares = Document.shared_with.through.objects.filter(document_id=OuterRef(document_field), group__user=user)
    return Q(**{owner_field: user}) | Q(Exists(shares))


def documents_readable_by(user: User) -> QuerySet[Document]:
    if not user.is_authenticated:
        return Document.objects.none()
    return Document.objects.filter(readable_filter(user))


def documents_owned_by(user: User) -> QuerySet[Document]:
    if not user.is_authenticated:
        return Document.objects.none()
    return Document.objects.filter(owner=user)


def document_for_user(*, user: User, document_id: int) -> Document | None:
    return documents_readable_by(user).select_related("owner", "parent").filter(pk=document_id).first()


def library_for_user(
    *,
    user: User,
    owner: str = "",
    state: str = "",
    kind: str = "",
    title: str = "",
    group_id: int | None = None,
) -> QuerySet[Document]:
    """The library page: top-level documents the user may read, with the page's filters. A file
    of a source that changed is listed once, as its latest version (the earlier ones are linked
    from its page)."""
    documents = (
        documents_readable_by(user)
        .filter(parent__isnull=True, replaced_by__isnull=True)
        .select_related("owner", "source")
    )
    if owner == "mine":
        documents = documents.filter(owner=user)
    elif owner == "shared":
        documents = documents.exclude(owner=user)
    if state:
        documents = documents.filter(state=state)
    if kind:
        documents = documents.filter(kind=kind)
    if title:
        documents = documents.filter(Q(title__icontains=title) | Q(filename__icontains=title))
    if group_id:
        documents = documents.filter(shared_with__id=group_id)
    return documents.prefetch_related("shared_with").order_by("-created_at")


def versions_of(*, user: User, document: Document) -> dict:
    """A source's file that changed: the newer version of this one (``newer``) and the earlier
    ones (``earlier``, newest first) that ``user`` may read."""
    readable = documents_readable_by(user)
    return {
        "newer": readable.filter(pk=document.replaced_by_id).first() if document.replaced_by_id else None,
        "earlier": list(readable.filter(replaced_by=document).order_by("-created_at")),
    }


def pages_of(document: Document) -> QuerySet[Page]:
    return Page.objects.filter(document=document).order_by("number")


def reply_context(*, user: User, document_id: int) -> tuple[str, list[int]]:
    """An e-mail ``user`` may read, to draft a reply to: its text (headers and body, as read) and
    its attachments that are ready to ground the reply on. ("", []) for anything else."""
    email = documents_readable_by(user).filter(pk=document_id, kind=Document.Kind.EMAIL).first()
    if email is None:
        return "", []
    text = "\n\n".join(pages_of(email).values_list("text", flat=True))
    attachments = documents_readable_by(user).filter(parent=email, state=Document.State.READY)
    return text, list(attachments.values_list("pk", flat=True))


# --- batches: their owner's alone -------------------------------------------------------------


def batches_of(user: User) -> QuerySet[Batch]:
    if not user.is_authenticated:
        return Batch.objects.none()
    return Batch.objects.filter(owner=user).order_by("-created_at")


def batch_for_user(*, user: User, batch_id: int) -> Batch | None:
    return batches_of(user).filter(pk=batch_id).first()


def batch_documents(batch: Batch) -> QuerySet[Document]:
    """The batch's files that became documents, in the order they were found."""
    return Document.objects.filter(batch=batch, parent__isnull=True).order_by("pk")


@dataclass(frozen=True)
class BatchStatus:
    state: str
    files_total: int
    files_done: int
    files_failed: int
    files_cancelled: int
    files_waiting: int  # not started
    files_reading: int  # being extracted or embedded
    files_skipped: int
    pages_done: int
    elapsed_s: float
    pages_per_s: float | None
    eta_s: float | None
    finished: bool

    @property
    def eta_words(self) -> str:
        if self.state == Batch.State.CANCELLED:
            return "none: cancelled" if self.finished else "none: cancelled, the file being read is stopping"
        return "done" if self.finished else format_duration(self.eta_s)


def batch_status(batch: Batch, *, now: datetime | None = None) -> BatchStatus:
    """Counts, rate and ETA of a batch: one query over its documents, one more per kind for
    the estimate of the files not opened yet."""
    unfinished = Q(state__in=UNFINISHED_STATES)
    opened = Q(pages_total__isnull=False, pages_total__gt=0) & ~Q(state=Document.State.CANCELLED)
    documents = batch_documents(batch)
    row = documents.aggregate(
        done=Count("pk", filter=Q(state=Document.State.READY)),
        failed=Count("pk", filter=Q(state=Document.State.FAILED)),
        cancelled=Count("pk", filter=Q(state=Document.State.CANCELLED)),
        waiting=Count("pk", filter=Q(state=Document.State.UPLOADED)),
        reading=Count("pk", filter=Q(state__in=[Document.State.EXTRACTING, Document.State.EMBEDDING])),
        pages_read=Sum("pages_done"),
        pages_left_known=Sum(F("pages_total") - F("pages_done"), filter=unfinished & Q(pages_total__isnull=False)),
    )
    finished = row["waiting"] + row["reading"] == 0
    cancelled = batch.state == Batch.State.CANCELLED
    samples: dict[str, dict[str, Sample]] = {"opened": {}, "unopened": {}}
    if not finished:
        by_kind = (
            documents.order_by()
            .values("kind")
            .annotate(  # grouped by kind alone
                opened_bytes=Sum("size_bytes", filter=opened),
                opened_pages=Sum("pages_total", filter=opened),
                unopened_bytes=Sum("size_bytes", filter=unfinished & Q(pages_total__isnull=True)),
            )
        )
        for kind in by_kind:
            if kind["opened_bytes"]:
                samples["opened"][kind["kind"]] = Sample(kind["opened_bytes"], kind["opened_pages"] or 0)
            if kind["unopened_bytes"]:
                samples["unopened"][kind["kind"]] = Sample(kind["unopened_bytes"])
    end = batch.finished_at or now or timezone.now()
    # Rounded as shown, and the rate taken over the same figure, so that a batch shown to have
    # run a second has a rate (0.96 s read as 1.0 had none, under MIN_ELAPSED_S).
    elapsed_s = round(max(0.0, (end - batch.created_at).total_seconds()), 1)
    rate = batch_rate(
        elapsed_s=elapsed_s,
        pages_done=row["pages_read"] or 0,
        pages_left_known=row["pages_left_known"] or 0,
        pages_unopened=pages_of_unopened(samples["opened"], samples["unopened"]),
    )
    return BatchStatus(
        state=batch.state,
        files_total=batch.files_total,
        files_done=row["done"],
        files_failed=row["failed"],
        files_cancelled=row["cancelled"],
        files_waiting=row["waiting"],
        files_reading=row["reading"],
        files_skipped=batch.files_skipped,
        pages_done=row["pages_read"] or 0,
        elapsed_s=elapsed_s,
        pages_per_s=None if rate.pages_per_s is None else round(rate.pages_per_s, 2),
        eta_s=None if finished or cancelled or rate.eta_s is None else round(rate.eta_s),
        finished=finished,
    )


# --- sources: the administrator's ---------------------------------------------------------------


def enabled_sources() -> QuerySet[Source]:
    """The sources being polled, with what their last polls did (for ``/metrics``)."""
    return Source.objects.filter(enabled=True).only("name", "kind", "last_error", "last_success_at").order_by("name")
