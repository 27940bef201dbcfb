"""A job's server-sent events, for the browser's page and for ``/api/v1/jobs/{id}/stream``.

``delta`` events carry text as it is written; ``queue`` events the place and ETA while the job
waits; then one of ``done``, ``failed`` or ``cancelled``. A stream that has expired from the
broker is replayed from what was stored: one ``snapshot`` with the whole text, then the end.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from django.http import StreamingHttpResponse

from inference import selectors, streaming
from inference.models import Job

QUEUE_REPORT_MS = 2_000  # while queued, the page is told its place this often
# A Redis stream entry id: ASCII digits only (``\d`` also matches "١"), nothing after it (``$``
# also matches before a final newline), each part within 64 bits; Redis refused anything else
# with an error after the stream's first bytes had gone, and the client reconnected with it
# every 2 s.
STREAM_ID = re.compile(r"(0|[0-9]{1,20}-[0-9]{1,20})")
_STREAM_ID_PART_MAX = 2**64 - 1


def valid_event_id(value: str | None) -> bool:
    if value is None:
        return True
    return bool(STREAM_ID.fullmatch(value)) and all(int(part) <= _STREAM_ID_PART_MAX for part in value.split("-"))


def final_event(job: Job) -> str:
    return {"succeeded": "done", "failed": "failed", "cancelled": "cancelled"}[job.state]


async def job_events(job: Job, *, after: str = "0") -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    if job.is_finished and not await streaming.stream_exists(job.pk):
        yield streaming.format_sse("snapshot", {"text": job.result_text})
        yield streaming.format_sse(final_event(job), {"detail": job.error, "note": job.result_note})
        return
    if not valid_event_id(after):
        after = "0"
    finishing = False
    async for event_id, event, data in streaming.read_events(job.pk, after=after, block_ms=QUEUE_REPORT_MS):
        if event != "keepalive":
            yield streaming.format_sse(event, data, event_id)
            continue
        # Nothing new for a while: say where the job stands. A job that has finished with nothing
        # left to send (the client resumed after the end, or the final event was lost) ends here.
        status = await selectors.ajob_queue_status(job_id=job.pk)
        if status is None:
            yield streaming.format_sse("failed", {"detail": "The job is gone.", "note": ""})
            return
        if status["state"] in Job.FINISHED_STATES and not finishing:
            finishing = True  # its final event may have arrived a moment ago: read once more
            continue
        if status["state"] in Job.FINISHED_STATES:
            job = await Job.objects.aget(pk=job.pk)
            yield streaming.format_sse(final_event(job), {"detail": job.error, "note": job.result_note})
            return
        if status["state"] == job.State.QUEUED:
            yield streaming.format_sse("queue", {"position": status["position"], "eta_s": status["eta_s"]})
        else:
            yield ": keepalive\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
