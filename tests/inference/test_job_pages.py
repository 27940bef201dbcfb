"""The jobs page, retry, exports and how results are shown: views over stored jobs (real
Postgres; no engine: the jobs are written as a worker leaves them)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from documents.models import Document
from inference.models import Job, JobKind, Queue

pytestmark = pytest.mark.django_db

HOSTILE = 'Fine summary.\n\n<script>alert("x")</script> <img src=x onerror="alert(1)"> [go](javascript:alert(1))'


@pytest.fixture
def people():
    User = get_user_model()
    return User.objects.create_user("erin", password="pw-erin-long-enough"), User.objects.create_user(
        "fred", password="pw-fred-long-enough"
    )


def _document(owner, title="Lease"):
    return Document.objects.create(
        owner=owner, title=title, filename=f"{title}.txt", size_bytes=1, sha256=title.ljust(64, "0"),
        state=Document.State.READY, pages_total=3,
    )  # fmt: skip


def _job(owner, kind=JobKind.SUMMARISE, state=Job.State.SUCCEEDED, document=None, **fields):
    queue = Queue.DECODE if kind in (JobKind.DRAFT, JobKind.CHAT) else Queue.PREFILL
    finished = timezone.now() if state in Job.FINISHED_STATES else None
    return Job.objects.create(
        owner=owner, kind=kind, queue=queue, state=state, document=document, finished_at=finished, **fields
    )


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_jobs_page_lists_only_mine_with_cancel_and_retry(people):
    erin, fred = people
    lease = _document(erin)
    queued = _job(erin, state=Job.State.QUEUED, document=lease, options={"length": "short"})
    failed = _job(erin, state=Job.State.FAILED, document=lease, error="The engine refused this job.", options={})
    done = _job(erin, document=lease, result_text="ok")
    theirs = _job(fred, document=_document(fred, "Theirs"))
    page = _client(erin).get("/jobs/").content.decode()
    for job in (queued, failed, done):
        assert f'data-job-id="{job.pk}"' in page
    assert str(theirs.pk) not in page
    assert f"/jobs/{queued.pk}/cancel" in page and f"/jobs/{failed.pk}/retry" in page
    assert f"/jobs/{done.pk}/retry" not in page and "position 1" in page
    assert "The engine refused this job." in page

    # While a job is unfinished, htmx fetches the rows again; once all are finished, it stops.
    assert 'hx-get="/jobs/rows"' in page and 'hx-trigger="every 2s"' in page
    rows = _client(erin).get("/jobs/rows").content.decode()
    assert rows.startswith('<tbody id="job-rows"') and str(theirs.pk) not in rows and "position 1" in rows
    Job.objects.filter(pk=queued.pk).update(state=Job.State.CANCELLED)
    assert "hx-get" not in _client(erin).get("/jobs/rows").content.decode()


def test_the_rows_of_queued_jobs_cost_the_same_queries_however_many_there_are(people):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    erin, _ = people
    lease = _document(erin)
    took_30s = timezone.now() - timezone.timedelta(seconds=30)
    _job(erin, document=lease, result_text="done", started_at=took_30s)  # an ETA to work out
    client = _client(erin)

    def queries_with(queued: int) -> int:
        while Job.objects.filter(state=Job.State.QUEUED).count() < queued:
            _job(erin, state=Job.State.QUEUED, document=lease, options={"length": "short"})
        with CaptureQueriesContext(connection) as captured:
            rows = client.get("/jobs/rows").content.decode()
        assert rows.count("position ") == queued and "about" in rows  # each row has its place and ETA
        return len(captured)

    assert queries_with(2) == queries_with(8)  # each queue's order and mean duration read once a page


def test_a_failed_job_is_tried_again_as_a_new_job_with_the_same_request(people):
    erin, fred = people
    lease = _document(erin)
    failed = _job(erin, state=Job.State.FAILED, document=lease, options={"length": "detailed", "focus": "rent"})
    response = _client(erin).post(f"/jobs/{failed.pk}/retry")
    again = Job.objects.exclude(pk=failed.pk).get()
    assert response["Location"] == f"/jobs/{again.pk}/"
    assert (again.kind, again.document_id, again.state) == (JobKind.SUMMARISE, lease.pk, Job.State.QUEUED)
    assert again.options == {"length": "detailed", "focus": "rent"}
    assert _client(fred).post(f"/jobs/{failed.pk}/retry").status_code == 404
    done = _job(erin, document=lease)
    _client(erin).post(f"/jobs/{done.pk}/retry")
    assert Job.objects.count() == 3  # a finished job is not run again


def test_model_output_is_shown_as_markdown_and_nothing_in_it_runs(people):
    erin, _ = people
    job = _job(erin, document=_document(erin), result_text=HOSTILE + "\n\n- **Rent**: monthly")
    page = _client(erin).get(f"/jobs/{job.pk}/").content.decode()
    assert "<li><strong>Rent</strong>: monthly</li>" in page
    body = page.split('id="job-output"', 1)[1].split("</div>", 1)[0]
    assert "<script" not in body and "<img" not in body and 'href="javascript' not in body
    assert "&lt;script&gt;" in body  # shown as the text it is


def test_a_draft_exports_as_markdown_and_word_with_its_sources(people):
    from docx import Document as WordDocument

    erin, fred = people
    lease = _document(erin)
    passages = [
        {"number": 1, "chunk_id": 1, "document_id": lease.pk, "document_title": "Lease", "page_start": 3,
         "page_end": 3, "text": "Three months' notice.", "char_start": 0, "char_end": 20},
    ]  # fmt: skip
    draft = _job(
        erin, kind=JobKind.DRAFT, result_text="Model text [1].",
        result_data={"passages": passages, "edited_text": "Give three months' notice [1].\n\nKind regards"},
    )  # fmt: skip
    markdown = _client(erin).get(f"/jobs/{draft.pk}/export.md")
    assert markdown["Content-Type"].startswith("text/markdown")
    text = markdown.content.decode()
    assert "Give three months' notice [1]." in text and "Model text" not in text  # the edited draft
    assert "- [1] Lease, p. 3: Three months' notice." in text

    word = _client(erin).get(f"/jobs/{draft.pk}/export.docx")
    assert word["Content-Disposition"].endswith('.docx"')
    paragraphs = [p.text for p in WordDocument(io.BytesIO(word.content)).paragraphs]
    assert "Give three months' notice [1]." in paragraphs and "Kind regards" in paragraphs
    assert "[1] Lease, p. 3: Three months' notice." in paragraphs

    assert _client(fred).get(f"/jobs/{draft.pk}/export.md").status_code == 404
    clauses = _job(erin, kind=JobKind.EXTRACT_CLAUSES, document=lease, result_text="- x")
    assert _client(erin).get(f"/jobs/{clauses.pk}/export.docx").status_code == 404
    assert _client(erin).get(f"/jobs/{clauses.pk}/export.md").status_code == 200


def test_a_summary_exports_each_statement_with_its_page(people):
    erin, _ = people
    statements = [
        {"text": "Rent is monthly.", "page": 2, "similarity": 0.8, "source": "matched"},
        {"text": "The moon is cheese.", "page": None, "similarity": 0.1, "source": "none"},
    ]
    job = _job(erin, document=_document(erin), result_text="Rent is monthly. The moon is cheese.",
               result_data={"statements": statements})  # fmt: skip
    text = _client(erin).get(f"/jobs/{job.pk}/export.md").content.decode()
    assert "- Rent is monthly. (p. 2)" in text
    assert "- The moon is cheese. (no page of the document says this)" in text
    page = _client(erin).get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/documents/{job.document_id}/#page-2">p. 2</a>' in page


def test_a_draft_export_leaves_out_passages_the_reader_may_no_longer_read(people):
    erin, fred = people
    theirs = _document(fred, "Fred's memo")
    passages = [
        {"number": 1, "chunk_id": 9, "document_id": theirs.pk, "document_title": "Fred's memo", "page_start": 1,
         "page_end": 1, "text": "The secret figure is 42.", "char_start": 0, "char_end": 10},
    ]  # fmt: skip
    draft = _job(erin, kind=JobKind.DRAFT, result_text="It is 42 [1].", result_data={"passages": passages})
    text = _client(erin).get(f"/jobs/{draft.pk}/export.md").content.decode()
    assert "- [1] a document you may no longer read" in text
    assert "secret figure" not in text and "Fred's memo" not in text
