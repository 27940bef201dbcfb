"""Reads for jobs, filtered by owner in the query itself."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from inference.models import Job


def job_for_user(*, user: AbstractBaseUser, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return Job.objects.select_related("document", "metrics").filter(owner=user, pk=job_id).first()


async def ajob_for_user(*, user: AbstractBaseUser, job_id) -> Job | None:
    if not user.is_authenticated:
        return None
    return await Job.objects.select_related("document").filter(owner=user, pk=job_id).afirst()
