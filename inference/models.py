from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class JobKind(models.TextChoices):
    SUMMARISE = "summarise", "Summary"
    EXTRACT_CLAUSES = "extract_clauses", "Clause extraction"
    DRAFT = "draft", "Drafted reply"
    CHAT = "chat", "Chat completion"  # messages in, text out: the API's chat and the benchmarks


class Queue(models.TextChoices):
    PREFILL = "prefill", "prefill"  # document jobs: long prompts, short answers
    DECODE = "decode", "decode"  # drafting and chat: short prompts, long answers


QUEUE_FOR_KIND = {
    JobKind.SUMMARISE: Queue.PREFILL,
    JobKind.EXTRACT_CLAUSES: Queue.PREFILL,
    JobKind.DRAFT: Queue.DECODE,
    JobKind.CHAT: Queue.DECODE,
}


class Job(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    FINISHED_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    document = models.ForeignKey(
        "documents.Document", on_delete=models.CASCADE, related_name="jobs", null=True, blank=True
    )
    kind = models.CharField(max_length=32, choices=JobKind.choices)
    queue = models.CharField(max_length=16, choices=Queue.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    options = models.JSONField(default=dict, blank=True)
    result_text = models.TextField(blank=True)
    result_note = models.TextField(blank=True)  # e.g. what part of a document the result covers
    result_data = models.JSONField(default=dict, blank=True)  # the kind's result: inference/job_results.py
    error = models.TextField(blank=True)
    # Starts that count against lifecycle.MAX_ATTEMPTS. While the job runs, also the running
    # attempt's fencing token: each of its writes is conditional on (RUNNING, this number).
    attempts = models.PositiveSmallIntegerField(default=0)
    # Times the engine died while this job was in it: at 2 the job is failed (it may be the cause).
    engine_crashes = models.PositiveSmallIntegerField(default=0)
    # Times it went back to wait for the engine host (down or restarting); bounded by
    # APPLIANCE_ENGINE_RETRY_WINDOW_S.
    engine_waits = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set by the worker while the job runs; a stale one means the worker died (the watchdog,
    # lifecycle.jobs_recover_stale).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The Celery queue its run_job messages go to (lifecycle.celery_queue_for when it was sent):
    # a worker of that queue claims the next job by fair share among the jobs sent there.
    celery_queue = models.CharField(max_length=16, blank=True)
    # When its latest message was published; None while queued means not published yet (the web
    # process died between commit and publish, or a requeue did): the watchdog publishes it.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Not claimed before this: the job waits for the engine host to come back.
    not_before = models.DateTimeField(null=True, blank=True)
    # Its latest claim; its owner's latest claim in a queue is when they were last served.
    claimed_at = models.DateTimeField(null=True, blank=True)
    # The engine its latest claim ran it on (``placement.engine_key``: node and engine address).
    engine = models.CharField(max_length=255, blank=True)
    # Finished parts of an unfinished job (a long document's sections), by a fingerprint of the
    # request that made each (and the model that answered), so that an attempt after the engine
    # or a worker died resumes. Emptied when the job succeeds; a failed or cancelled job keeps
    # it, and the job a person makes of it with "Try again" starts from it.
    checkpoint = models.JSONField(default=dict, blank=True)
    # The API token that asked for it (None: the browser, a benchmark); usage is counted per token.
    api_token = models.ForeignKey("api.ApiToken", on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            models.Index(fields=["queue", "state"]),
            models.Index(fields=["celery_queue", "state", "owner"], name="job_fair_share"),
            models.Index(fields=["owner", "celery_queue", "claimed_at"], name="job_owner_served"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.id}"

    def save(self, *args, **kwargs) -> None:
        if not self.celery_queue:  # a row made outside services (the admin, a shell, a test)
            self.celery_queue = self.queue
        super().save(*args, **kwargs)

    @property
    def is_finished(self) -> bool:
        return self.state in self.FINISHED_STATES


class IdempotencyKey(models.Model):
    """An ``Idempotency-Key`` a caller sent with a job request: the same key with the same request
    returns the same job; with another request it is refused. Kept for ``TTL``."""

    TTL_HOURS = 24

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_sha256 = models.CharField(max_length=64)  # method, path and body of the first request
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_per_owner")]

    def __str__(self) -> str:
        return f"{self.key} -> {self.job_id}"


class RequestMetrics(models.Model):
    """What the user felt for one engine request, measured by the worker that ran it."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="metrics")
    queue = models.CharField(max_length=16, choices=Queue.choices)
    engine = models.CharField(max_length=255, blank=True)  # the engine host's node name
    model = models.CharField(max_length=255, blank=True)
    scheduling = models.CharField(max_length=16, blank=True)  # the engine host's policy for it
    queue_wait_ms = models.FloatField(help_text="job created -> a worker started it")
    admission_wait_ms = models.FloatField(help_text="waiting in the engine for KV blocks and a turn")
    ttft_ms = models.FloatField(help_text="job created -> first token reached the worker")
    prefill_ms = models.FloatField(null=True, blank=True, help_text="admitted by the engine host -> first token")
    itl_mean_ms = models.FloatField(null=True, blank=True)
    itl_p95_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField()
    cached_prompt_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField()
    decode_tokens_per_s = models.FloatField(null=True, blank=True)
    kv_reservation_tokens = models.PositiveIntegerField()
    preemptions = models.PositiveIntegerField(default=0)
    engine_requests = models.PositiveSmallIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["queue", "-created_at"])]

    def __str__(self) -> str:
        return f"metrics for {self.job_id}"

    @property
    def preempted(self) -> bool:
        return self.preemptions > 0
