"""``/console`` (staff only) and the audit log of who read, shared, deleted or exported what."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from console.models import AuditEvent
from documents.models import Document
from inference.models import Job, JobKind, Queue, RequestMetrics

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    User = get_user_model()
    admin = User.objects.create_user("root", password="pw-root-long-enough", is_staff=True, is_superuser=True)
    staff = User.objects.create_user("gina", password="pw-gina-long-enough")
    return admin, staff


def _client(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _metrics(owner, queue, ttft_ms, itl_ms, *, output=100):
    kind = JobKind.DRAFT if queue == Queue.DECODE else JobKind.SUMMARISE
    job = Job.objects.create(owner=owner, kind=kind, queue=queue, state=Job.State.SUCCEEDED, finished_at=timezone.now())
    return RequestMetrics.objects.create(
        job=job, queue=queue, queue_wait_ms=5, admission_wait_ms=0, ttft_ms=ttft_ms, itl_mean_ms=itl_ms,
        itl_p95_ms=itl_ms * 2, prompt_tokens=50, output_tokens=output, kv_reservation_tokens=150,
        decode_tokens_per_s=1000 / itl_ms,
    )  # fmt: skip


def test_a_person_who_is_not_staff_gets_no_console(people):
    _, gina = people
    for path in ("/console/", "/console/audit"):
        response = _client(gina).get(path)
        assert response.status_code == 403 and "Staff only" in response.content.decode()
        anonymous = _client().get(path)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert "/console/" not in _client(gina).get("/documents/").content.decode()  # not even a link


def test_the_console_shows_queues_latency_failures_and_usage(people):
    admin, gina = people
    for ttft, itl in ((100, 20), (200, 40), (300, 60)):
        _metrics(gina, Queue.DECODE, ttft, itl)
    _metrics(admin, Queue.PREFILL, 5000, 30, output=10)
    Job.objects.create(owner=gina, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.QUEUED)
    Job.objects.create(
        owner=gina, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.FAILED, finished_at=timezone.now(),
        error="The engine refused this job: too long.",
    )  # fmt: skip
    response = _client(admin).get("/console/")
    assert response.status_code == 200
    latency = {row["queue"]: row for row in response.context["latency"]}
    assert latency["decode"]["requests"] == 3
    assert latency["decode"]["ttft_p50"] == 200 and latency["decode"]["ttft_p95"] == pytest.approx(290)
    assert latency["decode"]["itl_p50"] == 40
    queues = {row["name"]: row for row in response.context["queues"]}
    assert queues["prefill"]["queued"] == 1 and queues["prefill"]["oldest_wait_s"] >= 0
    usage = {row["user"]: row for row in response.context["usage"]}
    assert usage["gina"]["output_tokens"] == 300 and usage["root"]["prompt_tokens"] == 50
    assert usage["gina"]["jobs"] == 5  # jobs asked for: the three that ran, the queued one, the failed one
    page = response.content.decode()
    assert "The engine refused this job: too long." in page
    assert "<polyline" in page  # the TTFT chart
    assert 'id="console-engine"' in page


def test_reading_sharing_exporting_and_deleting_are_recorded(people):
    admin, gina = people
    legal = Group.objects.create(name="Legal")
    gina.groups.add(legal)
    document = Document.objects.create(
        owner=gina, title="Merger memo", filename="memo.txt", size_bytes=1, sha256="e" * 64,
        state=Document.State.READY, pages_total=1,
    )  # fmt: skip
    browser = _client(gina)
    browser.get(f"/documents/{document.pk}/")
    browser.post(f"/documents/{document.pk}/share", {"groups": [legal.pk]})
    job = Job.objects.create(
        owner=gina, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.SUCCEEDED, document=document,
        result_text="Short.", finished_at=timezone.now(),
    )  # fmt: skip
    browser.get(f"/jobs/{job.pk}/export.md")
    browser.post(f"/documents/{document.pk}/delete")
    events = list(AuditEvent.objects.order_by("at").values_list("username", "action", "target"))
    assert events == [
        ("gina", "read", "Merger memo"),
        ("gina", "share", "Merger memo"),
        ("gina", "export", "Summary of Merger memo (md)"),
        ("gina", "delete", "Merger memo"),
    ]
    assert AuditEvent.objects.get(action="share").detail == {"groups": ["Legal"]}

    page = _client(admin).get("/console/audit", {"user": "gina", "action": "share"}).content.decode()
    table = page.split('id="audit-table"', 1)[1]
    assert "<td>shared</td>" in table and "(with Legal)" in table
    assert "<td>exported</td>" not in table and "<td>read</td>" not in table


def test_admin_actions_cancel_and_retry_jobs(people, django_capture_on_commit_callbacks):
    admin, gina = people
    queued = Job.objects.create(owner=gina, kind=JobKind.CHAT, queue=Queue.DECODE, options={})
    failed = Job.objects.create(
        owner=gina, kind=JobKind.CHAT, queue=Queue.DECODE, state=Job.State.FAILED,
        options={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0.0},
    )  # fmt: skip
    browser = _client(admin)
    with django_capture_on_commit_callbacks(execute=False):
        browser.post("/admin/inference/job/", {"action": "retry", "_selected_action": [str(failed.pk)]})
    browser.post("/admin/inference/job/", {"action": "cancel", "_selected_action": [str(queued.pk)]})
    queued.refresh_from_db()
    assert queued.state == Job.State.CANCELLED
    again = Job.objects.exclude(pk__in=[queued.pk, failed.pk]).get()
    assert again.owner == gina and again.options["messages"] == failed.options["messages"]


def test_the_audit_log_and_admin_actions_need_their_permissions(people):
    from django.contrib.auth.models import Permission

    admin, gina = people
    viewer = get_user_model().objects.create_user("vera", password="pw-vera-long-enough", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    assert _client(viewer).get("/console/").status_code == 200
    refused = _client(viewer).get("/console/audit")
    assert refused.status_code == 403 and "view audit event" in refused.content.decode()
    job = Job.objects.create(owner=gina, kind=JobKind.CHAT, queue=Queue.DECODE, options={})
    _client(viewer).post("/admin/inference/job/", {"action": "cancel", "_selected_action": [str(job.pk)]})
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED  # a view-only administrator cannot cancel


def test_a_benchmark_never_takes_over_a_real_account(people):
    from django.core.management.base import CommandError

    from measure.benchmarking import bench_user

    get_user_model().objects.create_user("evaluate", password="pw-real-person-here")
    with pytest.raises(CommandError, match="real account"):
        bench_user("evaluate")
    assert bench_user("evaluate-other").is_active is False


def test_failed_jobs_name_their_document_and_owner_only_to_staff_who_may_read_jobs(people):
    admin, gina = people
    document = Document.objects.create(
        owner=gina, title="Confidential merger memo", filename="memo.txt", size_bytes=1, sha256="f" * 64,
        state=Document.State.READY, pages_total=1,
    )  # fmt: skip
    Job.objects.create(
        owner=gina, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.FAILED, document=document,
        finished_at=timezone.now(), error="Reading this file took too long.",
    )  # fmt: skip
    operator = get_user_model().objects.create_user("oscar", password="pw-oscar-long-enough", is_staff=True)
    page = _client(operator).get("/console/").content.decode()
    failures = page.split('id="failures-heading"', 1)[1].split("</section>", 1)[0]
    assert "Reading this file took too long." in failures  # why, for the operator
    assert "Confidential merger memo" not in failures and "gina" not in failures  # not what, nor whose
    assert "needs the permission to view jobs" in failures
    superuser_page = _client(admin).get("/console/").content.decode().split('id="failures-heading"', 1)[1]
    superuser_page = superuser_page.split("</section>", 1)[0]
    assert "Confidential merger memo" in superuser_page and "gina" in superuser_page
