"""The whole path with the real parts: browser-style upload -> ingest worker -> summary on the
prefill queue -> engine host with the real model -> streamed text and stored metrics."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.test import AsyncClient, Client
from django.urls import reverse
from django.utils.html import escape

from documents.models import Document, Page
from inference.models import Job, Queue, RequestMetrics
from tests.conftest import wait_until
from tests.pdfs import CONTRACT_PAGES, make_pdf

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _upload(browser, name: str, data: bytes):
    return browser.post(
        reverse("documents:library"), {"files": [SimpleUploadedFile(name, data, content_type="application/pdf")]}
    )


def _document_finished(document_id: int):
    document = Document.objects.get(pk=document_id)
    return document if document.is_finished else None


def _read_sse(body: str) -> list[tuple[str | None, str, dict]]:
    events = []
    for block in body.split("\n\n"):
        fields = {"id": None, "event": None, "data": []}
        for line in block.splitlines():
            if line.startswith("id: "):
                fields["id"] = line[4:]
            elif line.startswith("event: "):
                fields["event"] = line[7:]
            elif line.startswith("data: "):
                fields["data"].append(line[6:])
        if fields["event"]:
            events.append((fields["id"], fields["event"], json.loads("\n".join(fields["data"]))))
    return events


async def _collect_stream(user, job_id, last_event_id: str | None = None) -> str:
    client = AsyncClient()
    await client.aforce_login(user)
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    response = await client.get(reverse("inference:job_events", args=[job_id]), headers=headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    chunks = []
    async for chunk in response.streaming_content:
        chunks.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
    await sync_to_async(connections.close_all)()  # the view's thread opened one
    return "".join(chunks)


def test_upload_summarise_stream_and_metrics(browser, alice, workers, engine_host):
    response = _upload(browser, "services-agreement.pdf", make_pdf(CONTRACT_PAGES, title="Services agreement"))
    assert response.status_code == 302
    document = Document.objects.get(owner=alice)
    document = wait_until(lambda: _document_finished(document.pk), timeout_s=120, message="ingestion")
    assert document.state == Document.State.READY, document.failure_reason
    assert document.pages_total == 3
    pages = list(Page.objects.filter(document=document).order_by("number"))
    assert "4,800 pounds" in pages[1].text and "Confidentiality" in pages[2].text

    detail = browser.get(reverse("documents:detail", args=[document.pk]))
    assert detail.status_code == 200 and b"Summarise" in detail.content

    response = browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "short"})
    job = Job.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == reverse("inference:job", args=[job.pk])
    assert job.queue == Queue.PREFILL

    job = wait_until(
        lambda: (j := Job.objects.get(pk=job.pk)).is_finished and j, timeout_s=600, message="the summary job"
    )
    assert job.state == Job.State.SUCCEEDED, job.error
    assert len(job.result_text.split()) >= 5  # the real model wrote something of its own

    metrics = job.metrics
    stats = engine_host.stats()
    assert metrics.queue == Queue.PREFILL
    assert metrics.model == stats["model"]
    assert metrics.prompt_tokens > 150  # three pages of contract text, plus the instruction
    assert 0 < metrics.output_tokens <= 256
    assert metrics.kv_reservation_tokens == metrics.prompt_tokens + 256
    assert metrics.ttft_ms > 0 and metrics.queue_wait_ms >= 0
    assert metrics.ttft_ms >= metrics.queue_wait_ms  # the first token comes after the job started
    if metrics.output_tokens > 1:
        assert metrics.decode_tokens_per_s > 0 and metrics.itl_p95_ms >= 0

    # The text streamed through the broker is exactly the stored text, and ends with "done".
    body = asyncio.run(_collect_stream(alice, job.pk))
    events = _read_sse(body)
    deltas = [(event_id, data["text"]) for event_id, event, data in events if event == "delta"]
    assert events[-1][1] == "done"
    assert events[-1][2]["output_tokens"] == metrics.output_tokens
    assert "".join(text for _, text in deltas).strip() == job.result_text

    # A browser that reconnects after the second delta gets only the rest.
    if len(deltas) >= 3:
        resumed = _read_sse(asyncio.run(_collect_stream(alice, job.pk, last_event_id=deltas[1][0])))
        rest = "".join(data["text"] for _, event, data in resumed if event == "delta")
        assert rest == "".join(text for _, text in deltas[2:])

    page = browser.get(reverse("inference:job", args=[job.pk]))
    assert escape(job.result_text.split()[0]).encode() in page.content  # shown, as escaped text
    assert b"Time to first token" in page.content


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("notes.pdf", b"These are plain notes, not a PDF at all.\n" * 20, "not a PDF"),
        ("locked.pdf", make_pdf(["Salary review, strictly private."], password="s3cret"), "password"),
        ("scan.pdf", make_pdf(["", ""]), "No text could be found"),
    ],
)
def test_bad_files_fail_alone_with_a_clear_message(browser, alice, workers, name, data, message):
    good = _upload(browser, "good.pdf", make_pdf(["A perfectly ordinary page of text."]))
    assert good.status_code == 302
    _upload(browser, name, data)
    bad = Document.objects.get(owner=alice, filename=name)
    bad = wait_until(lambda: _document_finished(bad.pk), timeout_s=120, message="ingestion of the bad file")
    assert bad.state == Document.State.FAILED
    assert message in bad.failure_reason
    good_doc = wait_until(
        lambda: _document_finished(Document.objects.get(owner=alice, filename="good.pdf").pk),
        timeout_s=120,
        message="ingestion of the good file",
    )
    assert good_doc.state == Document.State.READY  # the bad file harmed nothing else
    page = browser.get(reverse("documents:detail", args=[bad.pk]))
    assert page.status_code == 200 and message.encode() in page.content
    assert browser.get(reverse("documents:library")).status_code == 200  # the app keeps serving


def test_another_user_cannot_see_or_summarise_my_document(browser, alice, workers):
    _upload(browser, "mine.pdf", make_pdf(["Private minutes of the board."]))
    document = Document.objects.get(owner=alice)
    other = get_user_model().objects.create_user(username="bob", password="another long password")
    intruder = Client()
    intruder.force_login(other)
    for url in (
        reverse("documents:detail", args=[document.pk]),
        reverse("documents:status", args=[document.pk]),
        reverse("documents:download", args=[document.pk]),
    ):
        assert intruder.get(url).status_code == 404
    assert intruder.post(reverse("inference:summarise", args=[document.pk])).status_code == 404
    assert b"mine.pdf" not in intruder.get(reverse("documents:library")).content
    assert not Job.objects.exists()


def test_cancelling_a_running_summary_aborts_it_in_the_engine(browser, alice, workers, engine_host):
    from inference import streaming

    long_text = [
        f"Clause {i}. The parties agree to meet every week and to write minutes of each meeting." for i in range(40)
    ]
    _upload(browser, "long.pdf", make_pdf(["\n".join(long_text[:20]), "\n".join(long_text[20:])]))
    document = Document.objects.get(owner=alice)
    wait_until(lambda: _document_finished(document.pk), timeout_s=120, message="ingestion")
    browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "detailed"})
    job = Job.objects.get(owner=alice)

    def first_delta_seen():
        entries = streaming.sync_client().xrange(streaming.stream_key(job.pk))
        return any(fields[b"event"] == b"delta" for _, fields in entries)

    wait_until(first_delta_seen, timeout_s=600, message="the first token")
    response = browser.post(reverse("inference:job_cancel", args=[job.pk]))
    assert response.status_code == 302

    def engine_idle():
        stats = engine_host.stats()
        return stats["kv_reserved_tokens"] == 0 and stats["running"] == 0

    wait_until(engine_idle, timeout_s=30, message="the engine to drop the cancelled request")
    time.sleep(1)  # the worker finishes its loop; nothing it does may revive the job
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert not RequestMetrics.objects.filter(job=job).exists()
    events = [fields[b"event"] for _, fields in streaming.sync_client().xrange(streaming.stream_key(job.pk))]
    assert b"cancelled" in events and b"done" not in events
