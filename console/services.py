"""Writes of the console: the audit log."""

from __future__ import annotations

import logging

from console.models import AuditEvent

logger = logging.getLogger(__name__)


def audit(request, action: str, *, target: str, document=None, job=None, **detail) -> None:
    """Record that the signed-in user did ``action`` to ``target``. Never stops the request it
    records: a failure to write is logged."""
    user = request.user if request.user.is_authenticated else None
    try:
        AuditEvent.objects.create(
            user=user,
            username=user.get_username() if user else "",
            action=action,
            document=document,
            job=job,
            target=target[:300],
            detail=detail,
            address=request.META.get("REMOTE_ADDR") or None,
        )
    except Exception:
        logger.exception("audit: could not record %s of %s", action, target)
