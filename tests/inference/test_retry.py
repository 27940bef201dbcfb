"""``services.job_retry``: a new job with the same request, checked again."""

from __future__ import annotations

import pytest

from inference import services
from inference.models import Job
from inference.sampling import SamplingExtras

pytestmark = pytest.mark.django_db


def test_a_retried_chat_keeps_every_sampling_option(alice):
    first = services.job_create_chat(
        owner=alice,
        messages=[{"role": "user", "content": "List three colours."}],
        max_tokens=20,
        temperature=0.4,
        top_p=0.9,
        seed=7,
        stop=["\n\n"],
        frequency_penalty=0.5,
        extras=SamplingExtras(presence_penalty=0.2, top_k=12, min_tokens=3),
    )
    assert first.options["top_k"] == 12
    Job.objects.filter(pk=first.pk).update(state=Job.State.FAILED)
    first.refresh_from_db()
    again = services.job_retry(job=first, user=alice)
    assert again.pk != first.pk and again.kind == first.kind
    assert again.options == first.options


def test_only_a_failed_or_cancelled_job_is_tried_again(alice):
    job = services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "Hello"}], max_tokens=5)
    with pytest.raises(services.JobRejected):
        services.job_retry(job=job, user=alice)
