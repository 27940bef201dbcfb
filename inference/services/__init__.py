"""Writes for jobs: create, cancel, retry, edit a draft. Views, API and tasks call these; what
happens to a job once it is sent (claims, runs, requeues, the watchdog) is ``lifecycle``.

``BrokerUnavailable`` is re-exported here because creating a job raises it."""

from __future__ import annotations

from appliance.broker import BrokerUnavailable
from inference.services.drafts import (
    DRAFT_EDIT_MAX_CHARS,
    DRAFT_MAX_DOCUMENTS,
    REGENERATE_TEMPERATURE,
    draft_check_edit,
    draft_check_failed,
    draft_check_or_say_why_not,
    draft_checks_run,
    draft_edit,
    job_create_draft,
    job_regenerate_draft,
)
from inference.services.jobs import (
    CHAT_MAX_MESSAGES,
    CHAT_MAX_TOKENS_LIMIT,
    JobRejected,
    QueueFull,
    job_cancel,
    job_create_chat,
    job_create_clauses,
    job_create_summary,
)
from inference.services.retry import job_retry

__all__ = [
    "BrokerUnavailable",
    "CHAT_MAX_MESSAGES",
    "CHAT_MAX_TOKENS_LIMIT",
    "DRAFT_EDIT_MAX_CHARS",
    "DRAFT_MAX_DOCUMENTS",
    "JobRejected",
    "QueueFull",
    "REGENERATE_TEMPERATURE",
    "draft_check_edit",
    "draft_check_failed",
    "draft_check_or_say_why_not",
    "draft_checks_run",
    "draft_edit",
    "job_cancel",
    "job_create_chat",
    "job_create_clauses",
    "job_create_draft",
    "job_create_summary",
    "job_regenerate_draft",
    "job_retry",
]
