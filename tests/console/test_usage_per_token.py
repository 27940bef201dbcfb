"""Usage per API token on ``/console``: each token's own jobs over the usage window, nothing else,
with the meaning the API's usage has (jobs asked for in the window, tokens their runs used)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from api import services
from console import selectors
from inference.models import Job, JobKind, Queue, RequestMetrics

pytestmark = pytest.mark.django_db


def _finished_job(owner, *, token=None, prompt=50, output=100, engine_requests=1, days_ago=0):
    job = Job.objects.create(
        owner=owner, kind=JobKind.CHAT, queue=Queue.DECODE, state=Job.State.SUCCEEDED, finished_at=timezone.now(),
        api_token=token,
    )  # fmt: skip
    metrics = RequestMetrics.objects.create(
        job=job, queue=Queue.DECODE, queue_wait_ms=5, admission_wait_ms=0, ttft_ms=100, itl_mean_ms=20,
        itl_p95_ms=40, prompt_tokens=prompt, output_tokens=output, kv_reservation_tokens=150,
        engine_requests=engine_requests,
    )  # fmt: skip
    if days_ago:
        then = timezone.now() - timedelta(days=days_ago)
        Job.objects.filter(pk=job.pk).update(created_at=then)
        RequestMetrics.objects.filter(pk=metrics.pk).update(created_at=then)
    return job


def test_usage_per_token_counts_only_that_tokens_jobs_in_the_window():
    User = get_user_model()
    root = User.objects.create_user("root", password="pw-root-long-enough", is_staff=True, is_superuser=True)
    gina = User.objects.create_user("gina", password="pw-gina-long-enough")
    case_system, _ = services.token_create(user=gina, name="Case system", scopes=["write"])
    mail, _ = services.token_create(user=gina, name="Mail plug-in", scopes=["write"])
    report, _ = services.token_create(user=root, name="Report", scopes=["admin"])

    _finished_job(gina, token=case_system, prompt=100, output=300, engine_requests=2)
    _finished_job(gina, token=case_system, prompt=10, output=20)
    _finished_job(gina, token=case_system, prompt=999, output=999, days_ago=40)  # outside the window
    _finished_job(gina, token=mail, prompt=7, output=5)
    _finished_job(gina, prompt=1000, output=1000)  # the web UI: no token
    Job.objects.create(owner=root, kind=JobKind.CHAT, queue=Queue.DECODE, api_token=report)  # queued: no tokens yet

    rows = {row["name"]: row for row in selectors.usage_per_token()}
    assert set(rows) == {"Case system", "Mail plug-in", "Report"}
    assert (rows["Report"]["jobs"], rows["Report"]["prompt_tokens"], rows["Report"]["output_tokens"]) == (1, 0, 0)
    assert rows["Case system"] == {
        "token_id": case_system.pk,
        "name": "Case system",
        "prefix": case_system.prefix,
        "username": "gina",
        "jobs": 2,
        "engine_requests": 3,
        "prompt_tokens": 110,
        "output_tokens": 320,
    }
    assert (rows["Mail plug-in"]["jobs"], rows["Mail plug-in"]["output_tokens"]) == (1, 5)
    assert [row["name"] for row in selectors.usage_per_token()] == [
        "Case system",
        "Mail plug-in",
        "Report",
    ]  # most out first
    since = timezone.now() - timedelta(days=60)
    assert {row["name"]: row["jobs"] for row in selectors.usage_per_token(since=since)}["Case system"] == 3
    # The per-user table still counts every job, with or without a token.
    assert {row["user"]: row["jobs"] for row in selectors.usage_per_user()}["gina"] == 4

    client = Client()
    client.force_login(root)
    response = client.get("/console/")
    assert response.context["usage_per_token"] == selectors.usage_per_token()
    table = response.content.decode().split('id="token-usage-table"', 1)[1].split("</table>", 1)[0]
    assert "Case system" in table and f"{case_system.prefix}…" in table and "Mail plug-in" in table
    assert "<td>320</td>" in table and "Report" in table
    assert f"/admin/api/apitoken/{case_system.pk}/change/" in table


def test_the_console_says_when_no_token_was_used():
    root = get_user_model().objects.create_user("root", password="pw", is_staff=True, is_superuser=True)
    _finished_job(root)
    client = Client()
    client.force_login(root)
    page = client.get("/console/").content.decode()
    assert "Usage per API token, last 30 days" in page
    assert 'id="token-usage-table"' not in page and "No jobs started with an API token yet." in page
