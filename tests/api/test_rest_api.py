"""``/api/v1`` through Django's test client against the real Postgres and broker: tokens and
scopes, the problem format, uploads, filters, sharing, jobs, idempotency, limits and usage.

Jobs made here are queued only once their transaction commits, which a test's never does: no
worker runs them (the integration tests and the live schemathesis run do)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from api.services import token_create, token_revoke
from documents.models import Document
from inference import services
from inference.models import Job, JobKind, Queue, RequestMetrics
from tests.factories import ready_document

pytestmark = pytest.mark.django_db


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="another long password")


def bearer(user, *scopes, **kwargs) -> dict:
    _, raw = token_create(user=user, name="a tool", scopes=list(scopes or ["read", "write"]), **kwargs)
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"].startswith("/api/problems/")
    return body


def test_no_credentials_revoked_or_expired_tokens_get_401_with_a_bearer_challenge(alice):
    client = Client()
    body = problem(client.get("/api/v1/documents"), 401)
    assert "Bearer" in body["detail"]
    assert client.get("/api/v1/documents")["WWW-Authenticate"].startswith("Bearer")
    token, raw = token_create(user=alice, name="old", scopes=["read"])
    assert client.get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    token_revoke(token=token)
    problem(client.get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}"), 401)
    _, soon = token_create(user=alice, name="soon", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1))
    from api.models import ApiToken

    ApiToken.objects.filter(name="soon").update(expires_at=timezone.now() - timedelta(seconds=1))
    problem(client.get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {soon}"), 401)
    problem(client.get("/api/v1/documents", HTTP_AUTHORIZATION="Bearer dapp_00000000_not-a-token"), 401)


def test_a_token_only_does_what_its_scopes_allow(alice, django_user_model):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    read_only = bearer(alice, "read")
    client = Client()
    assert client.get(f"/api/v1/documents/{document.pk}", **read_only).status_code == 200
    body = problem(
        client.post("/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json", **read_only),
        403,
    )
    assert body["type"] == "/api/problems/insufficient-scope" and "write" in body["detail"]
    assert not Job.objects.exists()
    problem(client.get("/api/v1/admin/usage", **bearer(alice, "read", "write")), 403)
    # A staff member's admin token reads everyone's usage; it stops working when staff status goes.
    admin = django_user_model.objects.create_user(username="root", password="x" * 20, is_staff=True)
    admin_token = bearer(admin, "admin")
    assert client.get("/api/v1/admin/usage", **admin_token).status_code == 200
    admin.is_staff = False
    admin.save(update_fields=["is_staff"])
    problem(client.get("/api/v1/admin/usage", **admin_token), 403)


def test_the_browser_session_reads_and_writes_with_its_csrf_token(alice):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/v1/documents").json()["count"] == 1
    body = problem(
        client.post("/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json"), 403
    )
    assert "CSRF" in body["detail"]
    client.get("/documents/")  # the page sets the CSRF cookie, as a browser would have it
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 201, response.content
    assert Job.objects.get().api_token is None


def test_upload_list_filter_detail_share_and_delete(alice, bob):
    staff = Group.objects.create(name="legal")
    alice.groups.add(staff)
    bob.groups.add(staff)
    auth = bearer(alice)
    client = Client()
    upload = SimpleUploadedFile("notes.txt", b"The meeting is on Tuesday.", content_type="text/plain")
    response = client.post("/api/v1/documents", {"file": upload}, **auth)
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["created"] is True and created["state"] == "uploaded" and created["owner"] == "alice"
    document = Document.objects.get(pk=created["id"])
    assert document.sha256 == hashlib.sha256(b"The meeting is on Tuesday.").hexdigest()
    again = client.post(
        "/api/v1/documents", {"file": SimpleUploadedFile("copy.txt", b"The meeting is on Tuesday.")}, **auth
    )
    assert again.status_code == 200 and again.json() | {"created": True} == created | {
        "updated_at": again.json()["updated_at"]
    }
    ready_document(alice, "lease", "The rent is 900 pounds a month.")

    listed = client.get("/api/v1/documents", {"state": "ready"}, **auth).json()
    assert [d["title"] for d in listed["results"]] == ["lease"] and listed["count"] == 1
    first = client.get("/api/v1/documents", {"page_size": 1}, **auth).json()
    assert first["count"] == 2 and len(first["results"]) == 1 and first["next"].endswith("page=2")
    assert client.get(first["next"], **auth).json()["previous"] is not None

    detail = client.get(f"/api/v1/documents/{document.pk}", **auth).json()
    assert detail["pages"] == [] and detail["state"] == "uploaded"

    shared = client.put(
        f"/api/v1/documents/{document.pk}/sharing", {"groups": [staff.pk]}, content_type="application/json", **auth
    )
    assert shared.status_code == 200 and shared.json()["shared_with"] == [{"id": staff.pk, "name": "legal"}]
    bobs = bearer(bob)
    assert client.get(f"/api/v1/documents/{document.pk}", **bobs).json()["is_owner"] is False
    problem(client.delete(f"/api/v1/documents/{document.pk}", **bobs), 403)  # a reader, not the owner
    outsider = Group.objects.create(name="finance")

    def refused(group_id: int) -> str:
        response = client.put(f"/api/v1/documents/{document.pk}/sharing", {"groups": [staff.pk, group_id]},
                              content_type="application/json", **auth)  # fmt: skip
        body = problem(response, 400)
        assert [e["field"] for e in body["errors"]] == ["groups"] and "groups you belong to" in body["detail"]
        return body["detail"].replace(str(group_id), "N")

    # A group one is not in and a group that does not exist get the same answer: ids say nothing.
    assert refused(outsider.pk) == refused(outsider.pk + 1000)
    assert list(document.shared_with.all()) == [staff]  # nothing changed

    assert client.delete(f"/api/v1/documents/{document.pk}", **auth).status_code == 204
    problem(client.get(f"/api/v1/documents/{document.pk}", **auth), 404)


def test_bad_input_is_400_naming_the_field(alice):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client()
    auth = bearer(alice)
    body = problem(client.post("/api/v1/jobs/summary", {}, content_type="application/json", **auth), 400)
    assert [e["field"] for e in body["errors"]] == ["document_id"]
    body = problem(
        client.post(
            "/api/v1/jobs/summary",
            {"document_id": document.pk, "length": "epic"},
            content_type="application/json",
            **auth,
        ),
        400,
    )
    assert body["errors"][0]["field"] == "length" and "length" in body["detail"]
    body = problem(client.get("/api/v1/documents", {"page": 0}, **auth), 400)
    assert body["errors"][0]["field"] == "page"
    body = problem(client.get("/api/v1/documents", {"owner": "everyone"}, **auth), 400)
    assert body["errors"][0]["field"] == "owner"
    body = problem(client.post("/api/v1/jobs/summary", "{not json", content_type="application/json", **auth), 400)
    assert body["errors"]
    problem(client.get("/api/v1/no-such-thing", **auth), 404)
    problem(client.get("/api/v1/jobs/not-a-uuid", **auth), 400)
    body = problem(
        client.post(
            "/api/v1/jobs/clauses",
            {"document_id": document.pk, "categories": ["Favourite colour"]},
            content_type="application/json",
            **auth,
        ),
        400,
    )
    assert body["errors"] == [{"field": "categories", "message": body["errors"][0]["message"]}]
    assert "Favourite colour" in body["detail"]
    Document.objects.filter(pk=document.pk).update(state=Document.State.EMBEDDING)
    body = problem(
        client.post("/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json", **auth), 400
    )
    assert body["errors"][0]["field"] == "document_id" and "not ready" in body["detail"]
    body = problem(
        client.post(
            "/api/v1/jobs/draft", {"message": "Hello?", "group_id": 999999}, content_type="application/json", **auth
        ),
        400,
    )
    assert body["errors"][0]["field"] == "group_id"
    too_many = list(range(1, services.DRAFT_MAX_DOCUMENTS + 2))  # a list no one can mean, bounded before use
    body = problem(
        client.post(
            "/api/v1/jobs/draft",
            {"message": "Hello?", "document_ids": too_many},
            content_type="application/json",
            **auth,
        ),
        400,
    )
    assert body["errors"][0]["field"] == "document_ids"
    with pytest.raises(services.JobRejected, match=f"at most {services.DRAFT_MAX_DOCUMENTS}"):
        services.job_create_draft(owner=alice, message="Hello?", document_ids=too_many)  # the browser's form too
    body = problem(
        client.get(
            f"/api/v1/jobs/{Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE).pk}/stream",
            HTTP_LAST_EVENT_ID="1; DROP",
            **auth,
        ),
        400,
    )
    assert body["errors"][0]["field"] == "Last-Event-ID"
    response = client.patch(f"/api/v1/documents/{document.pk}", **auth)
    assert problem(response, 405)["type"] == "/api/problems/method-not-allowed" and "GET" in response["Allow"]


def test_oversized_uploads_get_413_and_nothing_is_stored(alice, settings):
    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    client = Client()
    auth = bearer(alice)
    big = SimpleUploadedFile("big.txt", b"x" * (2 * 1024 * 1024))  # refused from its Content-Length
    body = problem(client.post("/api/v1/documents", {"file": big}, **auth), 413)
    assert "1 MB" in body["detail"]
    just_over = SimpleUploadedFile("over.txt", b"x" * (1024 * 1024 + 1000))  # refused by the endpoint
    body = problem(client.post("/api/v1/documents", {"file": just_over}, **auth), 413)
    assert "over.txt" in body["detail"]
    assert not Document.objects.exists()


def test_a_rate_limit_of_zero_is_refused_not_read_as_the_default(alice):
    from api.services import TokenRejected

    with pytest.raises(TokenRejected):
        token_create(user=alice, name="none at all", scopes=["read"], rate_limit_per_minute=0)


def test_a_tokens_rate_limit_gives_429_with_retry_after(alice):
    client = Client()
    auth = bearer(alice, "read", rate_limit_per_minute=2)
    assert client.get("/api/v1/documents", **auth).status_code == 200
    assert client.get("/api/v1/documents", **auth).status_code == 200
    response = client.get("/api/v1/documents", **auth)
    body = problem(response, 429)
    assert body["type"] == "/api/problems/rate-limited"
    assert 1 <= int(response["Retry-After"]) <= 60
    assert client.get("/api/v1/documents", **bearer(alice, "read")).status_code == 200  # another token is not limited


def test_a_persons_tokens_share_one_rate_limit_unless_one_was_given_its_own(alice, django_user_model, settings):
    """Making more tokens buys no more requests: a person's tokens with the default limit share
    one count; a token an administrator gave a limit of its own keeps its own."""
    import time

    settings.APPLIANCE_API_RATE_LIMIT_PER_MINUTE = 3
    if time.time() % 60 > 50:  # the count's window is a clock minute: start inside one
        time.sleep(61 - time.time() % 60)
    client = Client()
    tokens = [bearer(alice, "read") for _ in range(3)]
    assert [client.get("/api/v1/documents", **auth).status_code for auth in tokens] == [200, 200, 200]
    body = problem(client.get("/api/v1/documents", **bearer(alice, "read")), 429)  # a fourth, new token
    assert "Your tokens may make 3 requests a minute together" in body["detail"]
    assert client.get("/api/v1/documents", **bearer(alice, "read", rate_limit_per_minute=5)).status_code == 200
    bob = django_user_model.objects.create_user(username="bob", password="another long password")
    assert client.get("/api/v1/documents", **bearer(bob, "read")).status_code == 200  # another person's count


def test_a_full_queue_gives_429_with_retry_after(alice, settings):
    settings.APPLIANCE_MAX_QUEUE_DEPTH = 1
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client()
    auth = bearer(alice)
    first = client.post("/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json", **auth)
    assert first.status_code == 201
    response = client.post(
        "/api/v1/jobs/clauses", {"document_id": document.pk}, content_type="application/json", **auth
    )
    body = problem(response, 429)
    assert body["type"] == "/api/problems/queue-full" and int(response["Retry-After"]) >= 5
    assert Job.objects.count() == 1


def test_one_persons_queued_jobs_are_capped_with_429_naming_the_limit(alice, bob, settings):
    settings.APPLIANCE_MAX_QUEUED_PER_USER = 1
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client()
    auth = bearer(alice)
    assert (
        client.post(
            "/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json", **auth
        ).status_code
        == 201
    )
    response = client.post(
        "/api/v1/jobs/clauses", {"document_id": document.pk}, content_type="application/json", **auth
    )
    body = problem(response, 429)
    assert body["type"] == "/api/problems/queue-full" and int(response["Retry-After"]) >= 5
    assert "the most one person may have waiting at once (1)" in body["detail"]
    from inference import services

    services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "Hello"}])  # another queue
    chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hello"}]}
    response = client.post("/v1/chat/completions", chat, content_type="application/json", **auth)
    body = problem(response, 429)
    assert body["error"]["code"] == "queue-full" and "one person" in body["error"]["message"]


def test_creating_while_the_broker_is_down_is_503_with_retry_after_and_leaves_no_row(alice, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client()
    auth = bearer(alice)
    response = client.post(
        "/api/v1/jobs/summary", {"document_id": document.pk}, content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="try-1", **auth,
    )  # fmt: skip
    body = problem(response, 503)
    assert body["type"] == "/api/problems/unavailable" and int(response["Retry-After"]) > 0
    assert "Nothing was saved" in body["detail"]
    chat = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hello"}]}
    response = client.post("/v1/chat/completions", chat, content_type="application/json", **auth)
    assert problem(response, 503)["error"]["code"] == "unavailable" and int(response["Retry-After"]) > 0
    upload = SimpleUploadedFile("note.txt", b"The rent is due on the first day of the month.", "text/plain")
    problem(client.post("/api/v1/documents", {"file": upload}, **auth), 503)
    assert Job.objects.count() == 0 and Document.objects.count() == 1  # only the one made above


def test_idempotency_key_returns_the_same_job_and_refuses_another_request(alice, settings):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    client = Client()
    auth = bearer(alice)
    request = {"document_id": document.pk, "length": "short"}
    first = client.post(
        "/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1", **auth
    )
    again = client.post(
        "/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1", **auth
    )
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert first["Location"].endswith(f"/api/v1/jobs/{first.json()['id']}")
    assert Job.objects.count() == 1
    settings.APPLIANCE_MAX_QUEUE_DEPTH = 1  # full now: a retry still gets its job, not a 429
    late = client.post(
        "/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-1", **auth
    )
    assert late.status_code == 200 and late.json()["id"] == first.json()["id"]
    settings.APPLIANCE_MAX_QUEUE_DEPTH = 200
    other = client.post(
        "/api/v1/jobs/summary",
        {**request, "length": "detailed"},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k-1",
        **auth,
    )
    assert problem(other, 422)["type"] == "/api/problems/idempotency-key-reused"
    # Without a key, or with another, a retried request is a new job.
    client.post("/api/v1/jobs/summary", request, content_type="application/json", **auth)
    client.post("/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-2", **auth)
    assert Job.objects.count() == 3


def test_jobs_are_created_listed_read_and_cancelled(alice):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month. Notice is three months.")
    client = Client()
    auth = bearer(alice)
    summary = client.post(
        "/api/v1/jobs/summary", {"document_id": document.pk, "focus": "rent"}, content_type="application/json", **auth
    ).json()
    assert summary["kind"] == "summarise" and summary["queue"] == "prefill" and summary["state"] == "queued"
    assert summary["queue_place"]["position"] == 1 and summary["links"]["stream"].endswith("/stream")
    clauses = client.post(
        "/api/v1/jobs/clauses",
        {"document_id": document.pk, "taxonomy": "office", "categories": ["Termination"]},
        content_type="application/json",
        **auth,
    )
    assert clauses.status_code == 201, clauses.content
    draft = client.post(
        "/api/v1/jobs/draft",
        {"message": "What is the rent?", "document_ids": [document.pk], "tone": "formal"},
        content_type="application/json",
        **auth,
    ).json()
    assert draft["queue"] == "decode" and draft["options"]["document_ids"] == [document.pk]
    assert {j.api_token.name for j in Job.objects.all()} == {"a tool"}

    listed = client.get("/api/v1/jobs", {"kind": "draft"}, **auth).json()
    assert [j["id"] for j in listed["results"]] == [draft["id"]]
    cancelled = client.post(f"/api/v1/jobs/{summary['id']}/cancel", **auth).json()
    assert cancelled["state"] == "cancelled"
    problem(client.post(f"/api/v1/jobs/{summary['id']}/cancel", **auth), 409)


def _finished_draft(owner, cited: Document, *, sentence: str = "As stated [1].", passage: str = "Stated.") -> Job:
    """A draft that finished citing one passage of ``cited``."""
    return Job.objects.create(
        owner=owner,
        kind=JobKind.DRAFT,
        queue=Queue.DECODE,
        state=Job.State.SUCCEEDED,
        result_text=sentence,
        result_data={
            "sentences": [{"text": sentence, "supported": True, "citations": [1]}],
            "passages": [{"number": 1, "document_id": cited.pk, "document_title": cited.title, "text": passage}],
        },
    )


def test_a_finished_job_has_its_result_and_metrics_and_hides_passages_no_longer_readable(alice, bob):
    shared = Group.objects.create(name="legal")
    alice.groups.add(shared)
    bob.groups.add(shared)
    theirs = ready_document(bob, "policy", "Refunds take ten days.")
    theirs.shared_with.add(shared)
    job = _finished_draft(alice, theirs, sentence="Refunds take ten days [1].", passage="Refunds take ten days.")
    RequestMetrics.objects.create(
        job=job, queue="decode", queue_wait_ms=5, admission_wait_ms=1, ttft_ms=120, prompt_tokens=300,
        output_tokens=12, decode_tokens_per_s=40.0, kv_reservation_tokens=812,
    )  # fmt: skip
    client = Client()
    auth = bearer(alice)
    body = client.get(f"/api/v1/jobs/{job.pk}", **auth).json()
    assert body["result"]["text"] == "Refunds take ten days [1]."
    assert body["result"]["data"]["sentences"][0]["supported"] is True
    assert body["result"]["data"]["passages"][0]["text"] == "Refunds take ten days."
    assert body["metrics"]["ttft_ms"] == 120 and body["metrics"]["decode_tokens_per_s"] == 40.0
    alice.groups.remove(shared)
    body = client.get(f"/api/v1/jobs/{job.pk}", **auth).json()
    assert body["result"]["data"]["passages"] == [{"number": 1, "readable": False}]
    assert "Refunds take ten days." not in json.dumps(body["result"]["data"]["passages"])


def test_a_page_of_drafts_looks_up_what_its_reader_may_read_once_not_once_a_draft(alice, bob):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, auth = Client(), bearer(alice)

    def listed() -> tuple[dict, int]:
        with CaptureQueriesContext(connection) as queries:
            body = client.get("/api/v1/jobs", {"kind": "draft"}, **auth).json()
        return body, len(queries)

    _finished_draft(alice, ready_document(alice, "mine 0", "Stated."))
    listed()  # the token's first use records when it was used (a write later requests skip)
    _, with_one = listed()
    for n in range(1, 6):
        _finished_draft(alice, ready_document(alice, f"mine {n}", "Stated."))
    gone = _finished_draft(alice, ready_document(bob, "theirs", "Stated."))  # cited, not shared with her
    body, with_seven = listed()
    assert with_seven == with_one
    passages = {job["id"]: job["result"]["data"]["passages"] for job in body["results"]}
    assert len(passages) == 7
    assert passages.pop(str(gone.pk)) == [{"number": 1, "readable": False}]
    assert all(p[0]["text"] == "Stated." for p in passages.values())


def test_usage_counts_the_callers_requests_and_tokens_per_token(alice, bob):
    from api.models import ApiToken

    auth = bearer(alice)
    tool = ApiToken.objects.get(user=alice)
    for owner, token, tokens_in in ((alice, tool, 100), (alice, None, 50), (bob, None, 999)):
        job = Job.objects.create(owner=owner, kind=JobKind.CHAT, queue=Queue.DECODE, api_token=token)
        RequestMetrics.objects.create(
            job=job, queue="decode", queue_wait_ms=1, admission_wait_ms=0, ttft_ms=10, prompt_tokens=tokens_in,
            output_tokens=7, kv_reservation_tokens=1,
        )  # fmt: skip
    Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, api_token=tool)  # queued: no tokens yet
    usage = Client().get("/api/v1/usage", **auth).json()
    assert (usage["requests"], usage["prompt_tokens"], usage["output_tokens"]) == (3, 150, 14)
    by_token = {row["token"]: (row["requests"], row["prompt_tokens"]) for row in usage["by_token"]}
    assert by_token == {f"a tool ({tool.prefix}…)": (2, 100), None: (1, 50)}
    assert usage["by_kind"] == [
        {"kind": "chat", "requests": 3, "engine_requests": 2, "prompt_tokens": 150, "output_tokens": 14}
    ]


def test_the_schema_is_valid_openapi_and_documents_every_operation_with_its_errors():
    from openapi_spec_validator import validate

    schema = Client().get("/api/schema").json()
    assert schema["openapi"].startswith("3.")
    validate(schema)  # raises on anything the OpenAPI 3.1 specification does not allow
    operations = [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method != "parameters"
    ]
    assert {"/api/v1/documents", "/api/v1/jobs/{job_id}/stream", "/api/v1/usage", "/api/v1/engine"} <= schema[
        "paths"
    ].keys()
    for path, method, op in operations:
        codes = set(op["responses"])
        assert {"400", "401"} <= codes, (method, path, codes)
        if "{" in path:
            assert "404" in codes, (method, path, codes)
        for code in codes - {"200", "201", "204"}:
            assert list(op["responses"][code]["content"]) == ["application/problem+json"], (method, path, code)


def test_interactive_docs_are_for_staff(alice, django_user_model):
    client = Client()
    client.force_login(alice)
    assert client.get("/api/docs").status_code == 403
    client.force_login(django_user_model.objects.create_user(username="ops", password="x" * 20, is_staff=True))
    page = client.get("/api/docs").content.decode()
    assert "swagger-ui-bundle.js" in page and "/static/ninja/" in page  # served here: no CDN on-prem
    assert "cdn." not in page and "https://" not in page.split("<body", 1)[0]


def test_no_two_schemas_share_a_name():
    """The schema's components are named after their classes: two of one name would silently
    describe one endpoint's body with the other's fields."""
    import importlib
    import inspect

    from ninja import Schema

    modules = [importlib.import_module(m) for m in ("api.problems", "api.pagination", "api.endpoints", "documents.api", "inference.api", "inference.openai_api.schemas")]  # fmt: skip
    names = [
        obj.__name__
        for module in modules
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Schema) and obj.__module__ == module.__name__
    ]
    assert len(names) > 20 and sorted(names) == sorted(set(names))


def test_a_withdrawn_share_withholds_the_results_made_from_the_document(alice, bob):
    """A summary is the document's words: once the owner un-shares it, the reader's job, its
    result and an Idempotency-Key replay of it are 404 (the job is kept, and back if re-shared)."""
    legal = Group.objects.create(name="legal")
    bob.groups.add(legal)
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    document.shared_with.add(legal)
    client, auth = Client(), bearer(bob)
    request = {"document_id": document.pk, "length": "short"}
    created = client.post(
        "/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-9", **auth
    )
    assert created.status_code == 201
    job_id = created.json()["id"]
    Job.objects.filter(pk=job_id).update(state=Job.State.SUCCEEDED, result_text="The rent is 900 pounds a month.")
    assert client.get(f"/api/v1/jobs/{job_id}", **auth).json()["result"]["text"].startswith("The rent")

    document.shared_with.remove(legal)
    problem(client.get(f"/api/v1/jobs/{job_id}", **auth), 404)
    replay = client.post(
        "/api/v1/jobs/summary", request, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k-9", **auth
    )
    problem(replay, 404)
    assert job_id not in {j["id"] for j in client.get("/api/v1/jobs", **auth).json()["results"]}
    browser = Client()
    browser.force_login(bob)
    assert browser.get(f"/jobs/{job_id}/").status_code == 404
    assert Job.objects.filter(pk=job_id).exists()  # kept

    document.shared_with.add(legal)
    assert client.get(f"/api/v1/jobs/{job_id}", **auth).status_code == 200
