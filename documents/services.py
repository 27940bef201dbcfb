"""Writes for documents. Views, API and tasks call these; nothing else writes Document or Page."""

from __future__ import annotations

import hashlib
import logging
from pathlib import PurePath

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from documents.extraction import ExtractionError, extract_pages
from documents.models import Document, Page

logger = logging.getLogger(__name__)


class UploadRejected(ValueError):
    """The upload is refused before anything is stored; the message is for the user."""


def _sha256(upload: UploadedFile) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def document_create(*, owner: AbstractBaseUser, upload: UploadedFile) -> tuple[Document, bool]:
    """Store an upload and queue its ingestion. Returns (document, created): the same bytes
    uploaded again by the same owner return the existing document and do no work."""
    limit_bytes = settings.APPLIANCE_MAX_UPLOAD_MB * 1024 * 1024
    if upload.size is not None and upload.size > limit_bytes:
        raise UploadRejected(
            f"{upload.name} is {upload.size / 1024 / 1024:.1f} MB; the limit is {settings.APPLIANCE_MAX_UPLOAD_MB} MB."
        )
    sha256 = _sha256(upload)
    existing = Document.objects.filter(owner=owner, sha256=sha256).first()
    if existing is not None:
        return existing, False
    filename = PurePath(upload.name or "upload").name[:255]
    with transaction.atomic():
        document = Document.objects.create(
            owner=owner,
            title=PurePath(filename).stem[:255] or filename,
            filename=filename,
            content_type=(upload.content_type or "")[:127],
            size_bytes=upload.size or 0,
            sha256=sha256,
            file=upload,
        )
        from documents.tasks import ingest_document

        ingest_document.delay_on_commit(document.pk)
    return document, True


def document_ingest(*, document_id: int) -> Document | None:
    """Extract the text of every page. Idempotent: a document already finished is left alone,
    one interrupted mid-way starts again. Returns None when the document is gone."""
    document = Document.objects.filter(pk=document_id).first()
    if document is None or document.is_finished:
        return document
    Document.objects.filter(pk=document_id).update(state=Document.State.EXTRACTING, pages_done=0)
    try:
        with document.file.open("rb") as handle:
            data = handle.read()
        extracted = extract_pages(data, filename=document.filename)
    except ExtractionError as exc:
        return _document_fail(document_id, str(exc))
    except OSError as exc:
        logger.warning("document %s: stored file unreadable: %s", document_id, exc)
        return _document_fail(document_id, "The stored file could not be read. Upload it again.")
    with transaction.atomic():
        Page.objects.filter(document_id=document_id).delete()
        Page.objects.bulk_create(
            [Page(document_id=document_id, number=index, text=text) for index, text in enumerate(extracted.pages, 1)],
            batch_size=500,
        )
        updates = {
            "state": Document.State.READY,
            "pages_total": len(extracted.pages),
            "pages_done": len(extracted.pages),
            "failure_reason": "",
        }
        if extracted.title:
            updates["title"] = extracted.title[:255]
        Document.objects.filter(pk=document_id).update(**updates)
    return Document.objects.get(pk=document_id)


def _document_fail(document_id: int, reason: str) -> Document | None:
    Document.objects.filter(pk=document_id).update(state=Document.State.FAILED, failure_reason=reason)
    return Document.objects.filter(pk=document_id).first()


def document_delete(*, document: Document) -> None:
    storage, name = document.file.storage, document.file.name
    with transaction.atomic():
        document.delete()
        transaction.on_commit(lambda: storage.delete(name))
