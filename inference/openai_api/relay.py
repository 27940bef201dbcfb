"""Waiting for the chat job and relaying its deltas as ``chat.completion.chunk`` server-sent
events (``text_completion`` ones for a raw prompt's completion), or its whole answer; a client
that goes away cancels its job."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from api.problems import ApiProblem
from inference import services, streaming
from inference.attempts import RECORDED
from inference.models import Job
from inference.openai_api.here import HereRun
from inference.openai_api.schemas import JOB_ID_HEADER
from inference.openai_api.translation import (
    ChatRequest,
    completion_id,
    error_event,
    finish_reason,
    measurements,
    unfinished_problem,
    usage,
)

logger = logging.getLogger(__name__)


# A waiting stream sends a comment this often, and the job's row is checked. Below the broker
# client's read timeout (redis-py's default is 5 s), which an XREAD blocking as long would hit,
# breaking every request whose job wrote nothing for that long (queued, or reading its prompt).
KEEPALIVE_MS = 2_000
# What a waiting /v1 stream sends then: one blank line, which the SSE standard ignores (it ends
# no event) and every client skips, and which keeps a proxy's read timeout from firing. Not an
# SSE comment (`: keepalive`): vLLM's bench client (`vllm bench serve`) strips each read it
# gets and then loses every message after a comment that came in a read of its own, so that a
# request that waited 2 s for its first token lost its chunks and was counted failed. Neither
# vLLM's server nor OpenAI's sends comments.
KEEPALIVE_LINE = "\n"
# The engine's reasons a successful answer ends for, as OpenAI names them.
FINISHES = ("stop", "length")


class StreamDiverged(Exception):
    """A restarted job writes something other than what the stream has already sent."""


class StreamedText:
    """What a stream has sent, kept equal to what the job stores. The worker stores a chat
    answer without its leading and trailing whitespace, so trailing whitespace is held back until
    more text follows; a raw completion's answer (``verbatim``) is stored and sent as written. A
    job the appliance restarts (its worker or engine was lost) writes its answer again from the
    start: what was sent already is not sent twice, as long as it is the same."""

    def __init__(self, *, verbatim: bool = False) -> None:
        self.sent = ""
        self._attempt = ""
        self._verbatim = verbatim
        self.caught_up = True  # this attempt has written all that was sent (a restarted one: not yet)

    def restart(self) -> None:
        self._attempt = ""
        self.caught_up = False

    def add(self, text: str) -> str:
        """The text to send now for a delta of the job's text."""
        self._attempt += text
        ready = self._attempt if self._verbatim else self._attempt.strip()
        if ready.startswith(self.sent):
            new, self.sent, self.caught_up = ready[len(self.sent) :], ready, True
            return new
        if self.sent.startswith(ready):
            return ""  # a restarted job catching up with what was sent
        raise StreamDiverged

    def rest(self, stored: str) -> str:
        """What is left to send of the stored answer (normally nothing)."""
        if not stored.startswith(self.sent):
            raise StreamDiverged
        return stored[len(self.sent) :]


async def _finished_job(job_id) -> Job:
    return await Job.objects.select_related("metrics").aget(pk=job_id)


async def _is_finished(job_id) -> bool:
    state = await Job.objects.filter(pk=job_id).values_list("state", flat=True).afirst()
    return state is None or state in Job.FINISHED_STATES


async def _cancel(job: Job) -> None:
    """The client went away: cancel its job, so that the engine stops writing for nobody."""
    try:
        # Shielded: the request's task is being cancelled, and this must still happen.
        await asyncio.shield(sync_to_async(services.job_cancel)(job=job))
    except Exception:
        logger.exception("job %s: the client went away, and the job could not be cancelled", job.pk)


async def _job_events(job: Job, here: HereRun | None = None) -> AsyncGenerator[tuple[str, dict], None]:
    """The job's events until it finishes: from its attempt in this process (``here``) as they
    arrive, then, should it go on elsewhere (put back for a worker, handed on), from its stream
    in the broker after the last point the stream had recorded (tokens sent beyond it were not
    recorded: the next attempt restarts the text, ``StreamedText``). The row is checked while nothing arrives, so
    that a final event the broker lost cannot leave the request waiting for ever."""
    after = "0"
    if here is not None:
        while (item := await _next_or_none(here.events, KEEPALIVE_MS / 1000)) is not None:
            if item is _KEEPALIVE:
                yield "keepalive", {}
                continue
            entry_id, event, data = item
            if entry_id:  # the stream has everything up to here: where to go on from, should it
                after = entry_id
            if event != RECORDED:
                yield event, data
        if await _is_finished(job.pk):
            return
    async with aclosing(streaming.read_events(job.pk, after=after, block_ms=KEEPALIVE_MS)) as events:
        async for _, event, data in events:
            yield event, data
            if event == "keepalive" and await _is_finished(job.pk):
                return


_KEEPALIVE: tuple[str, str, dict] = ("", "keepalive", {})


async def _next_or_none(events: asyncio.Queue, timeout_s: float) -> tuple[str, str, dict] | None:
    """The next of ``events``, or ``_KEEPALIVE`` when none came for ``timeout_s``."""
    if not events.empty():  # the usual case while tokens flow: no timer
        return events.get_nowait()
    try:
        return await asyncio.wait_for(events.get(), timeout_s)
    except TimeoutError:
        return _KEEPALIVE


async def _wait_for(job: Job, here: HereRun | None = None) -> Job:
    finished = False
    try:
        async with aclosing(_job_events(job, here)) as events:
            async for _event, _data in events:
                pass
        finished = True
    finally:
        if not finished:
            await _cancel(job)
    return await _finished_job(job.pk)


def _stream(
    job: Job,
    chat: ChatRequest,
    model: str,
    *,
    user_id: int | None = None,
    slot: str | None = None,
    here: HereRun | None = None,
) -> StreamingHttpResponse:
    """The completion's stream: ``chat.completion.chunk`` events, or ``text_completion`` ones for a
    raw prompt (``chat.raw``); ``slot``: the stream slot its person holds (given back at its
    end), None when no limit applies; ``here``: the job's attempt, when this process runs it."""
    base = {
        "id": completion_id(job, raw=chat.raw),
        "object": "text_completion" if chat.raw else "chat.completion.chunk",
        "created": int(job.created_at.timestamp()),
        "model": model,
    }

    def choice(delta: dict, finish: str | None) -> dict:
        if chat.raw:
            return {"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": finish}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> str:
        choices = [] if delta is None else [choice(delta, finish)]
        body = {**base, "choices": choices, **({"usage": None} if chat.include_usage else {}), **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def events() -> AsyncIterator[str]:
        finished = False
        text = StreamedText(verbatim=chat.raw)
        # This attempt's tokens, and when each batch of them reached the worker (sent with the next
        # chunk), for continuous_usage_stats.
        written = {"prompt_tokens": 0, "completion_tokens": 0}
        times: list = []
        role_sent = False
        finish_sent = False

        def content(delta: dict, finish: str | None = None, **extra) -> str:
            # The role goes with the first text, not ahead of the job: a client times the first
            # token from the first chunk (as vLLM's server sends them, back to back).
            nonlocal role_sent
            if not role_sent and not chat.raw:
                delta, role_sent = {"role": "assistant", "content": "", **delta}, True
            if not chat.continuous_usage:
                return chunk(delta, finish, **extra)
            usage_so_far = {**written, "total_tokens": sum(written.values())}
            appliance = {**extra.pop("appliance", {}), "token_times": list(times)}
            times.clear()
            return chunk(delta, finish, usage=usage_so_far, appliance=appliance, **extra)

        try:
            async with aclosing(_job_events(job, here)) as job_events:
                async for event, data in job_events:
                    if event == "delta":
                        written["completion_tokens"] += int(data.get("tokens", 0))
                        written["prompt_tokens"] = int(data.get("prompt_tokens", written["prompt_tokens"]))
                        times.extend(data.get("times", ()))
                        catching_up = not text.caught_up
                        new = text.add(str(data.get("text", "")))
                        # The engine's last text says why it ended: the finish goes with it, as
                        # vLLM's server sends it, not in a chunk of its own once the job is stored
                        # (a bench client would count that chunk as one more inter-token gap).
                        finish = data.get("finish_reason") if data.get("finish_reason") in FINISHES else None
                        if finish and text.caught_up and not finish_sent:
                            finish_sent = True
                            yield content({"content": new}, finish)
                        # Every delta leaves as a chunk when it arrives, as vLLM sends a chunk per
                        # step: whitespace the stored answer may strip rides with the next text,
                        # but its chunk is not held back (a client would time a stall that was not
                        # there), and the first token's chunk, whatever its text, is the role.
                        elif new or (not catching_up and int(data.get("tokens", 0)) > 0):
                            yield content({"content": new})
                    elif event == "restart":
                        text.restart()
                        written["completion_tokens"] = 0
                        times.clear()  # a finish already sent is not sent again
                    elif event == "keepalive":
                        yield KEEPALIVE_LINE
            done = await _finished_job(job.pk)
            if done.state != Job.State.SUCCEEDED:
                finished = True
                yield error_event(unfinished_problem(done))
                return
            rest = text.rest(done.result_text)
            if rest:
                yield content({"content": rest})
            if not finish_sent:
                # The finish chunk carries the last usage and times too: tokens that wrote no text.
                yield content({}, finish_reason(done), appliance=measurements(done))
            if chat.include_usage:
                if finish_sent:  # the measurements the finish chunk would have carried
                    yield chunk(usage=usage(done), appliance=measurements(done))
                else:
                    yield chunk(usage=usage(done))
            finished = True
            yield "data: [DONE]\n\n"
        except StreamDiverged:
            logger.warning("job %s: restarted with a different answer than the one streamed", job.pk)
            yield error_event(
                ApiProblem(
                    502,
                    "server-error",
                    "The appliance restarted this request (a worker or the engine was lost) and the new answer "
                    "differs from the part already sent. Send the request again.",
                )
            )
        except Exception:
            logger.exception("job %s: the chat completion stream broke", job.pk)
            yield error_event(ApiProblem(500, "server-error", "Something failed inside the appliance."))
        finally:
            if not finished:
                await _cancel(job)

    response = StreamingHttpResponse(streaming.held_stream(user_id, slot, events()), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response[JOB_ID_HEADER] = str(job.pk)
    return response
