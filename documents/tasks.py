"""Celery tasks of the ``ingest`` queue: thin, they take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from documents import services


@shared_task(acks_late=True, reject_on_worker_lost=True, soft_time_limit=600, time_limit=660, max_retries=2)
def ingest_document(document_id: int) -> None:
    services.document_ingest(document_id=document_id)
