"""Reads for documents, always filtered by who may read them in the query itself.

A user may read a document they own, or one shared with a group they belong to (an e-mail's
attachments follow their e-mail's sharing, since they are shared with it).
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import Exists, OuterRef, Q, QuerySet

from documents.models import Document, Page


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
    """The library page: top-level documents the user may read, with the page's filters."""
    documents = documents_readable_by(user).filter(parent__isnull=True).select_related("owner")
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


def pages_of(document: Document) -> QuerySet[Page]:
    return Page.objects.filter(document=document).order_by("number")
