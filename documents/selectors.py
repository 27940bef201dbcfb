"""Reads for documents, always filtered by who may read them in the query itself."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from documents.models import Document, Page


def documents_readable_by(user: AbstractBaseUser) -> QuerySet[Document]:
    if not user.is_authenticated:
        return Document.objects.none()
    return Document.objects.filter(owner=user)


def document_for_user(*, user: AbstractBaseUser, document_id: int) -> Document | None:
    return documents_readable_by(user).filter(pk=document_id).first()


def pages_of(document: Document) -> QuerySet[Page]:
    return Page.objects.filter(document=document).order_by("number")
