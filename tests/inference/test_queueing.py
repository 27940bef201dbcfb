"""Queue depth limits (429), queue position and ETA, and the watchdog for jobs whose worker died.
Database only: the broker is replaced by a recorder where a job would be sent (named below)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from documents.models import Document
from inference import selectors, services
from inference.models import Job, JobKind, Queue

pytestmark = pytest.mark.django_db


def _document(owner) -> Document:
    return Document.objects.create(
        owner=owner, title="Lease", filename="lease.txt", size_bytes=10, sha256="0" * 64, state=Document.State.READY
    )


def _job(owner, *, state=Job.State.QUEUED, queue=Queue.PREFILL, **fields) -> Job:
    kind = JobKind.SUMMARISE if queue == Queue.PREFILL else JobKind.CHAT
    return Job.objects.create(owner=owner, kind=kind, queue=queue, state=state, **fields)


def test_a_full_queue_refuses_new_jobs_with_429_and_retry_after(browser, alice):
    document = _document(alice)
    _job(alice)
    _job(alice)
    with override_settings(APPLIANCE_MAX_QUEUE_DEPTH=2):
        response = browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "short"})
    assert response.status_code == 429
    assert 5 <= int(response["Retry-After"]) <= 600
    assert b"2 jobs are already waiting" in response.content
    assert Job.objects.count() == 2  # nothing was created
    with override_settings(APPLIANCE_MAX_QUEUE_DEPTH=3):
        response = browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "short"})
    assert response.status_code == 302 and Job.objects.count() == 3


def test_the_depth_limit_counts_only_the_jobs_queue(alice):
    _job(alice, queue=Queue.DECODE)
    with override_settings(APPLIANCE_MAX_QUEUE_DEPTH=1):
        with pytest.raises(services.QueueFull):
            services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "hi"}])
        services.job_create_summary(owner=alice, document=_document(alice))  # the prefill queue is empty


def test_queue_position_and_eta_from_this_queues_recent_jobs(alice):
    now = timezone.now()
    jobs = [_job(alice) for _ in range(3)]
    assert [selectors.queue_position(job) for job in jobs] == [1, 2, 3]
    assert selectors.queue_eta_s(queue=Queue.PREFILL, position=3) is None  # nothing measured yet
    # Two finished prefill jobs that took 10 s and 20 s; a decode job that must not count.
    _job(
        alice,
        state=Job.State.SUCCEEDED,
        started_at=now - timedelta(seconds=30),
        finished_at=now - timedelta(seconds=20),
    )
    _job(
        alice, state=Job.State.SUCCEEDED, started_at=now - timedelta(seconds=25), finished_at=now - timedelta(seconds=5)
    )
    _job(alice, state=Job.State.SUCCEEDED, queue=Queue.DECODE, started_at=now - timedelta(seconds=500), finished_at=now)
    with override_settings(APPLIANCE_PREFILL_CONCURRENCY=2):
        # Position 3 with 2 at a time: two rounds of 15 s.
        assert selectors.queue_eta_s(queue=Queue.PREFILL, position=3) == pytest.approx(30.0)
        assert selectors.job_queue_status(jobs[0]) == {"position": 1, "eta_s": pytest.approx(15.0)}
    jobs[0].state = Job.State.RUNNING
    assert selectors.queue_position(jobs[0]) == 0


def test_the_job_page_shows_its_place_in_the_queue(browser, alice):
    _job(alice)
    mine = _job(alice)
    page = browser.get(reverse("inference:job", args=[mine.pk])).content.decode()
    assert "Position 2 in the prefill queue" in page


def test_chat_jobs_check_their_input(alice):
    with pytest.raises(services.JobRejected, match="non-empty list"):
        services.job_create_chat(owner=alice, messages=[])
    with pytest.raises(services.JobRejected, match="role"):
        services.job_create_chat(owner=alice, messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(services.JobRejected, match="max_tokens"):
        services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "x"}], max_tokens=0)
    job = services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "x"}], max_tokens=5)
    assert job.queue == Queue.DECODE and job.options["max_tokens"] == 5


def test_one_person_cannot_fill_a_queue_for_everyone(browser, alice, django_user_model):
    document = _document(alice)
    _job(alice)
    _job(alice)
    with override_settings(APPLIANCE_MAX_QUEUED_PER_USER=2):
        response = browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "short"})
        assert response.status_code == 429
        assert 5 <= int(response["Retry-After"]) <= 600
        assert b"the most one person may have waiting at once (2)" in response.content
        # Someone else still gets in, and alice's jobs on the other queue are not counted.
        bob = django_user_model.objects.create_user(username="bob", password="another long password")
        services.job_create_summary(owner=bob, document=_document(bob))
        services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "hi"}])
    with override_settings(APPLIANCE_MAX_QUEUED_PER_USER=0):  # no per-person limit (benchmarks)
        services.job_create_summary(owner=alice, document=document)


def test_the_queue_limits_leave_room_for_many_people():
    from appliance import settings as defaults

    assert defaults.APPLIANCE_MAX_QUEUE_DEPTH >= 10 * defaults.APPLIANCE_MAX_QUEUED_PER_USER


DEAD_BROKER = "redis://127.0.0.1:9/0"  # the discard port: nothing listens


def test_creating_a_job_while_the_broker_is_down_is_503_with_retry_after_and_writes_nothing(browser, alice):
    document = _document(alice)
    with override_settings(CELERY_BROKER_URL=DEAD_BROKER):
        response = browser.post(reverse("inference:summarise", args=[document.pk]), {"length": "short"})
        assert response.status_code == 503
        assert int(response["Retry-After"]) > 0
        page = response.content.decode()
        assert "The job could not be queued" in page and "message broker does not answer" in page
        response = browser.post(reverse("inference:draft_new"), {"message": "When is the invoice paid?"})
        assert response.status_code == 503
    assert Job.objects.count() == 0
