"""Every endpoint in the OpenAPI schema, walked as a user who must not see Alice's document and
job: each one that names them answers 404 (never 403: Bob must not learn they exist), and each
list, search or usage leaves them out. A new endpoint fails this test until it is walked too."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from api.services import token_create
from documents.models import Batch, Document
from inference.models import Job, JobKind, Queue
from tests.factories import ready_document

pytestmark = pytest.mark.django_db

SECRET = "The Kestrel acquisition closes on 14 March for 4.2 million pounds."


@pytest.fixture
def walk(alice, django_user_model):
    bob = django_user_model.objects.create_user(username="bob", password="another long password")
    document = ready_document(alice, "kestrel", SECRET)
    job = Job.objects.create(
        owner=alice, document=document, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.SUCCEEDED,
        result_text=SECRET,
    )  # fmt: skip
    _, raw = token_create(user=bob, name="bob's tool", scopes=["read", "write"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}"), document, job


def _json(client, method, path, body=None):
    return getattr(client, method)(
        path, json.dumps(body) if body is not None else None, content_type="application/json"
    )


def not_found(response):
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert "kestrel" not in response.content.decode().lower()


def never_shows(response, status=200):
    assert response.status_code == status, response.content
    text = response.content.decode()
    assert "Kestrel" not in text and "kestrel" not in text


def test_every_endpoint_hides_what_the_caller_may_not_read(walk):
    client, document, job = walk
    d, j = document.pk, job.pk
    batch = Batch.objects.create(owner=document.owner, name="kestrel.zip", files_total=1)
    Document.objects.filter(pk=d).update(batch=batch)
    b = batch.pk
    checks = {
        ("get", "/api/v1/documents"): lambda: never_shows(client.get("/api/v1/documents")),
        ("post", "/api/v1/documents"): lambda: None,  # makes the caller's own document; nothing of others'
        ("get", "/api/v1/documents/{document_id}"): lambda: not_found(client.get(f"/api/v1/documents/{d}")),
        ("delete", "/api/v1/documents/{document_id}"): lambda: not_found(client.delete(f"/api/v1/documents/{d}")),
        ("put", "/api/v1/documents/{document_id}/sharing"): lambda: not_found(
            _json(client, "put", f"/api/v1/documents/{d}/sharing", {"groups": []})
        ),
        ("post", "/api/v1/documents/{document_id}/cancel"): lambda: not_found(
            client.post(f"/api/v1/documents/{d}/cancel")
        ),
        ("post", "/api/v1/batches"): lambda: None,  # makes the caller's own batch; nothing of others'
        ("get", "/api/v1/batches"): lambda: never_shows(client.get("/api/v1/batches")),
        ("get", "/api/v1/batches/{batch_id}"): lambda: not_found(client.get(f"/api/v1/batches/{b}")),
        ("post", "/api/v1/batches/{batch_id}/cancel"): lambda: not_found(client.post(f"/api/v1/batches/{b}/cancel")),
        ("get", "/api/v1/batches/{batch_id}/stream"): lambda: not_found(client.get(f"/api/v1/batches/{b}/stream")),
        ("get", "/api/v1/search"): lambda: never_shows(
            client.get("/api/v1/search", {"q": "When does the acquisition close, for how many pounds?", "document": d})
        ),
        ("post", "/api/v1/jobs/summary"): lambda: not_found(
            _json(client, "post", "/api/v1/jobs/summary", {"document_id": d})
        ),
        ("post", "/api/v1/jobs/clauses"): lambda: not_found(
            _json(client, "post", "/api/v1/jobs/clauses", {"document_id": d})
        ),
        ("post", "/api/v1/jobs/draft"): lambda: not_found(
            _json(client, "post", "/api/v1/jobs/draft", {"message": "When does Kestrel close?", "document_ids": [d]})
        ),
        ("get", "/api/v1/jobs"): lambda: never_shows(client.get("/api/v1/jobs")),
        ("get", "/api/v1/jobs/{job_id}"): lambda: not_found(client.get(f"/api/v1/jobs/{j}")),
        ("post", "/api/v1/jobs/{job_id}/cancel"): lambda: not_found(client.post(f"/api/v1/jobs/{j}/cancel")),
        ("get", "/api/v1/jobs/{job_id}/stream"): lambda: not_found(client.get(f"/api/v1/jobs/{j}/stream")),
        ("get", "/api/v1/usage"): lambda: never_shows(client.get("/api/v1/usage")),
        ("get", "/api/v1/admin/usage"): lambda: never_shows(client.get("/api/v1/admin/usage"), status=403),
        ("get", "/api/v1/engine"): lambda: never_shows(client.get("/api/v1/engine")),
        # The capacity planner reads a model's shape and the engine's report: no user's data.
        ("get", "/api/v1/capacity"): lambda: never_shows(
            client.get("/api/v1/capacity", {"layers": 32, "kv_heads": 8, "head_dim": 128, "parameters": 8.03e9})
        ),
        # The OpenAI-compatible routes read no document: a chat's messages and a completion's
        # prompt are the caller's own.
        ("get", "/v1/models"): lambda: never_shows(client.get("/v1/models")),
        ("get", "/v1/models/{model}"): lambda: never_shows(client.get("/v1/models/no-such-model"), status=404),
        ("post", "/v1/chat/completions"): lambda: None,
        ("post", "/v1/completions"): lambda: None,
    }
    schema = Client().get("/api/schema").json()
    operations = {(m, p) for p, item in schema["paths"].items() for m in item if m != "parameters"}
    assert operations == set(checks), f"walk these too: {sorted(operations - set(checks))}"
    for check in checks.values():
        check()
    job.refresh_from_db()
    assert job.state == Job.State.SUCCEEDED  # Bob's cancel did nothing
    assert Job.objects.filter(owner__username="bob").count() == 0
    document.refresh_from_db()  # Bob's delete did nothing
    batch.refresh_from_db()
    assert batch.state == Batch.State.RUNNING  # Bob's cancel of the batch did nothing
    assert document.state == Document.State.READY and not document.cancel_requested  # nor of the document
