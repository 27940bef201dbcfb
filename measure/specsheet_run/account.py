"""The ``specsheet`` account the requests come from, and its API token."""

from __future__ import annotations

from datetime import datetime

USERNAME = "specsheet"


class _Account:
    """A ``specsheet`` account that cannot sign in (no password), with an API token for this run
    only (it expires with the run). Afterwards the token is revoked, the account's documents and
    jobs are deleted and the account is switched off."""

    def __init__(self, user, token_row, token: str) -> None:
        self.user, self.token_row, self.token = user, token_row, token

    @classmethod
    def create(cls, *, expires_at: datetime) -> _Account:
        from api.services import token_create
        from measure.benchmarking import api_bench_user

        user = api_bench_user(USERNAME, deletes="documents and jobs")
        cls._clear(user)  # what a run that was killed left
        row, token = token_create(
            user=user,
            name="manage.py specsheet",
            scopes=["read", "write"],
            expires_at=expires_at,
            rate_limit_per_minute=100_000,  # the run's own polling and streams, not a person's
            max_streams=100_000,
        )
        return cls(user, row, token)

    @staticmethod
    def _clear(user) -> None:
        from api.models import ApiToken
        from api.services import token_revoke
        from documents.models import Document
        from inference.models import Job
        from inference.services import job_cancel

        for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
            token_revoke(token=token)
        for job in Job.objects.filter(owner=user).exclude(state__in=Job.FINISHED_STATES):
            job_cancel(job=job)  # a worker still writing stops at its next batch
        Job.objects.filter(owner=user).delete()
        for document in Document.objects.filter(owner=user):
            document.delete()

    def close(self) -> None:
        self._clear(self.user)
        self.user.is_active = False
        self.user.save(update_fields=["is_active"])
