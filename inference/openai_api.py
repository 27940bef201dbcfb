"""The OpenAI-compatible endpoints (``/v1/models``, ``/v1/chat/completions``), so that the
official ``openai`` clients and the tools built on them work against the appliance unchanged.

A chat completion is an ordinary chat job (``services.job_create_chat``): it waits in the decode
queue, runs on the same engine host as everything else, counts in its token's usage and records
its metrics. The operation waits for the job by reading the job's event stream (``streaming``),
and either answers with the whole ``chat.completion`` or relays the deltas as
``chat.completion.chunk`` server-sent events. A client that goes away cancels its job, which
frees the engine.

What the engine cannot do is refused with a 400 that names the field (tools, images, ``n`` > 1,
JSON output), never ignored: a client must not believe it got what it did not. Fields the
appliance has no use for (``user``, ``metadata``, ``store``, unknown ones) are ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Field, Router, Schema
from pydantic import WithJsonSchema

from api.auth import READ, WRITE
from api.problems import ApiProblem, bad_field, responses
from inference import services, streaming
from inference.models import Job

logger = logging.getLogger(__name__)

router = Router()

# A waiting stream sends a comment this often, and the job's row is checked. Below the broker
# client's read timeout (redis-py's default is 5 s), which an XREAD blocking as long would hit,
# breaking every request whose job wrote nothing for that long (queued, or reading its prompt).
KEEPALIVE_MS = 2_000
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
STOP_SEQUENCES_MAX = 4  # as OpenAI
OWNED_BY = "appliance"
JOB_ID_HEADER = "X-Appliance-Job-Id"


# --- the served model ------------------------------------------------------------------------


def served_model_id() -> str:
    """The id clients name the model by: the model directory's name, as the engine host reports
    it (``stats()["model"]``) and the job metrics record it."""
    return Path(settings.APPLIANCE_MODEL).name


def served_model() -> dict:
    path = Path(settings.APPLIANCE_MODEL)
    try:
        created = int(path.stat().st_mtime)  # when the model was installed on this appliance
    except OSError:  # a web node without the model's files (the engine runs elsewhere)
        created = 0
    return {"id": served_model_id(), "object": "model", "created": created, "owned_by": OWNED_BY}


def model_or_404(model: str) -> dict:
    served = served_model()
    if model != served["id"]:
        raise ApiProblem(
            404,
            "not-found",
            f"The model {model!r} does not exist on this appliance; it serves {served['id']!r} (see GET /v1/models).",
        )
    return served


# --- schemas ---------------------------------------------------------------------------------

TEXT_PART_SCHEMA = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
# ``str | list`` unions are checked by ``chat_request`` rather than by pydantic, so that a wrong
# value is refused naming its field (``messages.0.content.1.type``), not a union branch.
Content = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART_SCHEMA}],
            "description": "The text, or a list of text parts (joined with newlines). Other part types are refused.",
        }
    ),
]
Stop = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "maxItems": STOP_SEQUENCES_MAX},
                {"type": "null"},
            ],
            "description": "Up to 4 sequences where the model stops; they are not included in the text.",
        }
    ),
]
ToolChoice = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]})]


class ChatMessageIn(Schema):
    role: str = Field(..., description="system (or developer), user or assistant.")
    content: Content = None
    name: str | None = Field(None, description="Accepted and ignored.")
    tool_calls: list[dict[str, Any]] | None = Field(None, description="Not supported.")
    function_call: dict[str, Any] | None = Field(None, description="Not supported.")


class StreamOptions(Schema):
    include_usage: bool = Field(False, description="Send a last chunk with the token usage and no choices.")
    continuous_usage_stats: bool = Field(
        False,
        description="vLLM's extension: every content chunk (and the finish chunk) also carries `usage` so far, "
        "and `appliance.token_times`, when each of its tokens reached the worker as [unix time, tokens] pairs, so "
        "a client can time each token (as `manage.py specsheet` does).",
    )


class ChatCompletionRequest(Schema):
    """OpenAI's chat completion request. Unknown fields are ignored."""

    model: str = Field(..., description="The id of a model from GET /v1/models.")
    messages: list[ChatMessageIn] = Field(..., min_length=1, max_length=services.CHAT_MAX_MESSAGES)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=services.CHAT_MAX_TOKENS_LIMIT, description="Takes precedence over max_tokens."
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=services.CHAT_MAX_TOKENS_LIMIT,
        description="The most tokens to write (default 512); the KV cache is reserved for them.",
    )
    temperature: float | None = Field(None, ge=0, le=2, description="Default 1, as OpenAI's.")
    top_p: float | None = Field(None, gt=0, le=1, description="Default 1.")
    seed: int | None = Field(None, ge=-(2**63), lt=2**63, description="Makes sampling repeatable.")
    stop: Stop = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Default 0.")
    presence_penalty: float | None = Field(None, description="Only 0 (not supported).")
    n: int | None = Field(None, description="Only 1.")
    stream: bool | None = Field(False, description="Answer with server-sent events of chat.completion.chunk.")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="Accepted and ignored.")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported.")
    tool_choice: ToolChoice = Field(None, description='Only "none".')
    functions: list[dict[str, Any]] | None = Field(None, description="Not supported.")
    function_call: ToolChoice = Field(None, description='Only "none".')
    response_format: dict[str, Any] | None = Field(None, description='Only {"type": "text"}.')
    logprobs: bool | None = Field(None, description="Not supported.")
    top_logprobs: int | None = Field(None, description="Not supported.")
    logit_bias: dict[str, Any] | None = Field(None, description="Not supported.")
    ignore_eos: bool = Field(
        False,
        description="vLLM's extension: write exactly `max_tokens` tokens, past the end of the answer (for load tests).",
    )


class ModelCard(Schema):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(..., description="Unix time the model was installed on the appliance (0 if unknown).")
    owned_by: str


class ModelList(Schema):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AssistantMessage(Schema):
    role: Literal["assistant"] = "assistant"
    content: str


class CompletionChoice(Schema):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class Usage(Schema):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ApplianceMeasurements(Schema):
    """What the appliance measured for this request (an extension; OpenAI clients ignore it)."""

    job_id: str
    queue_wait_ms: float | None = Field(None, description="Request received -> a worker started it.")
    ttft_ms: float | None = Field(None, description="Request received -> the first token.")
    decode_tokens_per_s: float | None = None


class ChatCompletion(Schema):
    id: str = Field(..., description="chatcmpl-<job id>")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    appliance: ApplianceMeasurements


STREAM_DOC = {
    "responses": {
        200: {
            "description": (
                "Without `stream`: the `chat.completion`. With `stream: true`: server-sent events, each "
                "`data: <chat.completion.chunk JSON>`. The first chunk leaves when the first token has been "
                'written, and carries the role with the first text (`{"role": "assistant", "content": '
                '"Dear"}`), so that a client times the first token from it; then the rest of the text as '
                "`content` deltas, then a chunk with `finish_reason`, then (with "
                "`stream_options.include_usage`) a chunk with `usage` and no choices, then `data: [DONE]`. "
                "While the request waits in the queue or reads its prompt, only comment lines "
                "(`: keepalive`) keep the connection open: no chunk. A job that fails or is cancelled ends "
                'the stream with `data: {"error": {...}}` (no `[DONE]`), before any chunk if it wrote '
                "nothing. Header `X-Appliance-Job-Id` names the job."
            ),
            "headers": {
                JOB_ID_HEADER: {"description": "The appliance job that answered.", "schema": {"type": "string"}}
            },
            "content": {
                "text/event-stream": {
                    "schema": {"type": "string"},
                    "example": (
                        ": keepalive\n\n"
                        'data: {"id": "chatcmpl-…", "object": "chat.completion.chunk", "created": 1767225600, '
                        '"model": "SmolLM2-135M-Instruct", "choices": [{"index": 0, "delta": {"role": '
                        '"assistant", "content": "Dear"}, "logprobs": null, "finish_reason": null}]}\n\n'
                        'data: {"id": "chatcmpl-…", …, "choices": [{"index": 0, "delta": {"content": " Sir"}, '
                        '"logprobs": null, "finish_reason": null}]}\n\n'
                        'data: {"id": "chatcmpl-…", …, "choices": [{"index": 0, "delta": {}, "logprobs": null, '
                        '"finish_reason": "stop"}]}\n\n'
                        "data: [DONE]\n\n"
                    ),
                }
            },
        }
    }
}


# --- translating a request (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """An OpenAI request in the appliance's terms: ``job_options`` are ``job_create_chat``'s."""

    job_options: dict[str, Any]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False


def chat_request(payload: ChatCompletionRequest) -> ChatRequest:
    """Check what pydantic cannot and translate; raises a 400 ``ApiProblem`` naming the field."""
    if payload.n not in (None, 1):
        raise bad_field("n", "only n=1 is supported: the appliance writes one choice per request.")
    for name in ("tools", "functions"):
        if getattr(payload, name):
            raise bad_field(name, "tools and function calling are not supported by this appliance.")
    for name in ("tool_choice", "function_call"):
        if getattr(payload, name) not in (None, "none"):
            raise bad_field(name, 'tools and function calling are not supported by this appliance; only "none".')
    if payload.response_format is not None and payload.response_format.get("type", "text") != "text":
        raise bad_field(
            "response_format", f'{payload.response_format.get("type")!r} is not supported; only {{"type": "text"}}.'
        )
    if payload.logprobs or payload.top_logprobs:
        raise bad_field("logprobs" if payload.logprobs else "top_logprobs", "log probabilities are not supported.")
    if payload.logit_bias:
        raise bad_field("logit_bias", "logit_bias is not supported.")
    if payload.presence_penalty:
        raise bad_field("presence_penalty", "presence_penalty is not supported; frequency_penalty is.")

    options: dict[str, Any] = {"messages": [chat_message(m, f"messages.{i}") for i, m in enumerate(payload.messages)]}
    max_tokens = payload.max_completion_tokens if payload.max_completion_tokens is not None else payload.max_tokens
    if max_tokens is not None:
        options["max_tokens"] = max_tokens  # else job_create_chat's default
    options["temperature"] = 1.0 if payload.temperature is None else payload.temperature  # OpenAI's default
    if payload.top_p is not None:
        options["top_p"] = payload.top_p
    if payload.seed is not None:
        options["seed"] = payload.seed
    if payload.frequency_penalty is not None:
        options["frequency_penalty"] = payload.frequency_penalty
    stop = stop_sequences(payload.stop)
    if stop:
        options["stop"] = stop
    if payload.ignore_eos:
        options["ignore_eos"] = True
    stream_options = payload.stream_options if payload.stream else None
    return ChatRequest(
        job_options=options,
        stream=bool(payload.stream),
        include_usage=bool(stream_options and stream_options.include_usage),
        continuous_usage=bool(stream_options and stream_options.continuous_usage_stats),
    )


def chat_message(message: ChatMessageIn, field: str) -> dict[str, str]:
    if message.role in ("tool", "function"):
        raise bad_field(f"{field}.role", "tool and function messages are not supported: the appliance calls no tools.")
    if message.role not in ROLES:
        raise bad_field(f"{field}.role", f"{message.role!r} is not a role; use system, developer, user or assistant.")
    if message.tool_calls or message.function_call:
        name = "tool_calls" if message.tool_calls else "function_call"
        raise bad_field(f"{field}.{name}", "tools and function calling are not supported by this appliance.")
    return {"role": ROLES[message.role], "content": message_text(message.content, f"{field}.content")}


def message_text(content: Any, field: str) -> str:
    """A message's content as one text: a string, or its text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_field(field, "must be a string or a list of text parts.")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_field(f"{field}.{i}", 'a content part must be an object such as {"type": "text", "text": "…"}.')
        if part.get("type") != "text":
            raise bad_field(
                f"{field}.{i}.type",
                f"only text parts are supported; the appliance cannot read {part.get('type')!r} parts.",
            )
        if not isinstance(part.get("text"), str):
            raise bad_field(f"{field}.{i}.text", "a text part needs its text as a string.")
        texts.append(part["text"])
    return "\n".join(texts)


def stop_sequences(stop: Any) -> list[str]:
    if stop is None:
        return []
    sequences = [stop] if isinstance(stop, str) else stop
    if not isinstance(sequences, list) or not all(isinstance(s, str) and s for s in sequences):
        raise bad_field("stop", "must be a non-empty string or a list of them.")
    if len(sequences) > STOP_SEQUENCES_MAX:
        raise bad_field("stop", f"at most {STOP_SEQUENCES_MAX} stop sequences.")
    return sequences


# --- answering (pure) ------------------------------------------------------------------------


def finish_reason(job: Job) -> str:
    metrics = getattr(job, "metrics", None)
    written = metrics.output_tokens if metrics else 0
    return "length" if written >= int(job.options["max_tokens"]) else "stop"


def usage(job: Job) -> dict[str, int]:
    metrics = getattr(job, "metrics", None)
    prompt, completion = (metrics.prompt_tokens, metrics.output_tokens) if metrics else (0, 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def measurements(job: Job) -> dict[str, Any]:
    metrics = getattr(job, "metrics", None)
    measured = {"job_id": str(job.pk), "queue_wait_ms": None, "ttft_ms": None, "decode_tokens_per_s": None}
    if metrics is not None:
        for name in ("queue_wait_ms", "ttft_ms", "decode_tokens_per_s"):
            value = getattr(metrics, name)
            measured[name] = None if value is None else round(value, 1)
    return measured


def completion_id(job: Job) -> str:
    return f"chatcmpl-{job.pk}"


def chat_completion(job: Job, *, model: str) -> dict[str, Any]:
    return {
        "id": completion_id(job),
        "object": "chat.completion",
        "created": int(job.created_at.timestamp()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": job.result_text},
                "logprobs": None,
                "finish_reason": finish_reason(job),
            }
        ],
        "usage": usage(job),
        "appliance": measurements(job),
    }


def unfinished_problem(job: Job) -> ApiProblem:
    """The problem for a job that did not succeed."""
    headers = {JOB_ID_HEADER: str(job.pk)}
    if job.state == Job.State.CANCELLED:
        # Someone cancelled it on purpose (the web UI, the jobs API): asking again is not the fix.
        headers["x-should-retry"] = "false"
        return ApiProblem(409, "conflict", f"The job {job.pk} answering this request was cancelled.", headers=headers)
    # The worker already retried what was passing (an engine restart, a lost worker): what failed
    # here fails again the same way (a prompt too long for the context), so clients should not
    # send it three times.
    headers["x-should-retry"] = "false"
    return ApiProblem(
        502, "model-failed", f"The model could not answer: {job.error or 'the job failed.'}", headers=headers
    )


def error_event(problem: ApiProblem) -> str:
    """OpenAI's in-stream error, which the openai clients raise as ``APIError``."""
    error = {"message": problem.detail, "type": problem.code.replace("-", "_"), "param": None, "code": problem.code}
    return f"data: {json.dumps({'error': error})}\n\n"


class StreamDiverged(Exception):
    """A restarted job writes something other than what the stream has already sent."""


class StreamedText:
    """What a stream has sent, kept equal to what the job stores. The worker stores the answer
    without its leading and trailing whitespace, so trailing whitespace is held back until more
    text follows. A job the appliance restarts (its worker or engine was lost) writes its answer
    again from the start: what was sent already is not sent twice, as long as it is the same."""

    def __init__(self) -> None:
        self.sent = ""
        self._attempt = ""
        self.caught_up = True  # this attempt has written all that was sent (a restarted one: not yet)

    def restart(self) -> None:
        self._attempt = ""
        self.caught_up = False

    def add(self, text: str) -> str:
        """The text to send now for a delta of the job's text."""
        self._attempt += text
        ready = self._attempt.strip()
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


# --- waiting for the job ---------------------------------------------------------------------


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


async def _job_events(job: Job) -> AsyncIterator[tuple[str, dict]]:
    """The job's events until it finishes. The row is checked while nothing arrives, so that a
    final event the broker lost cannot leave the request waiting for ever."""
    async with aclosing(streaming.read_events(job.pk, after="0", block_ms=KEEPALIVE_MS)) as events:
        async for _, event, data in events:
            yield event, data
            if event == "keepalive" and await _is_finished(job.pk):
                return


async def _wait_for(job: Job) -> Job:
    finished = False
    try:
        async with aclosing(_job_events(job)) as events:
            async for _event, _data in events:
                pass
        finished = True
    finally:
        if not finished:
            await _cancel(job)
    return await _finished_job(job.pk)


def _stream(
    job: Job, chat: ChatRequest, model: str, *, user_id: int | None = None, slot: str | None = None
) -> StreamingHttpResponse:
    """The chat completion's stream; ``slot``: the stream slot its person holds (given back at
    its end), None when no limit applies."""
    base = {"id": completion_id(job), "object": "chat.completion.chunk", "created": int(job.created_at.timestamp())}
    base["model"] = model

    def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        body = {**base, "choices": choices, **({"usage": None} if chat.include_usage else {}), **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def events() -> AsyncIterator[str]:
        finished = False
        text = StreamedText()
        # This attempt's tokens, and when each batch of them reached the worker (sent with the next
        # chunk), for continuous_usage_stats.
        written = {"prompt_tokens": 0, "completion_tokens": 0}
        times: list = []
        role_sent = False

        def content(delta: dict, finish: str | None = None, **extra) -> str:
            # The role goes with the first text, not ahead of the job: a client times the first
            # token from the first chunk (as vLLM's server sends them, back to back).
            nonlocal role_sent
            if not role_sent:
                delta, role_sent = {"role": "assistant", "content": "", **delta}, True
            if not chat.continuous_usage:
                return chunk(delta, finish, **extra)
            usage_so_far = {**written, "total_tokens": sum(written.values())}
            appliance = {**extra.pop("appliance", {}), "token_times": list(times)}
            times.clear()
            return chunk(delta, finish, usage=usage_so_far, appliance=appliance, **extra)

        try:
            async with aclosing(_job_events(job)) as job_events:
                async for event, data in job_events:
                    if event == "delta":
                        written["completion_tokens"] += int(data.get("tokens", 0))
                        written["prompt_tokens"] = int(data.get("prompt_tokens", written["prompt_tokens"]))
                        times.extend(data.get("times", ()))
                        catching_up = not text.caught_up
                        new = text.add(str(data.get("text", "")))
                        # Every delta leaves as a chunk when it arrives, as vLLM sends a chunk per
                        # step: whitespace the stored answer may strip rides with the next text,
                        # but its chunk is not held back (a client would time a stall that was not
                        # there), and the first token's chunk, whatever its text, is the role.
                        if new or (not catching_up and int(data.get("tokens", 0)) > 0):
                            yield content({"content": new})
                    elif event == "restart":
                        text.restart()
                        written["completion_tokens"] = 0
                        times.clear()
                    elif event == "keepalive":
                        yield ": keepalive\n\n"
            done = await _finished_job(job.pk)
            if done.state != Job.State.SUCCEEDED:
                finished = True
                yield error_event(unfinished_problem(done))
                return
            rest = text.rest(done.result_text)
            if rest:
                yield content({"content": rest})
            # The finish chunk carries the last usage and times too: tokens that wrote no text.
            yield content({}, finish_reason(done), appliance=measurements(done))
            if chat.include_usage:
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


# --- operations ------------------------------------------------------------------------------


@router.get("/models", auth=READ, response=responses(403, 429, ok={200: ModelList}), summary="List the models")
def models_list(request: HttpRequest):
    """The model this appliance serves; pass its `id` as `model`."""
    return {"object": "list", "data": [served_model()]}


@router.get(
    "/models/{path:model}", auth=READ, response=responses(403, 404, 429, ok={200: ModelCard}), summary="Get a model"
)
def models_get(request: HttpRequest, model: str):
    """The model named `model`, or 404 if the appliance does not serve it."""
    return model_or_404(model)


@router.post(
    "/chat/completions",
    auth=WRITE,
    response=responses(403, 404, 409, 429, 502, 503, ok={200: ChatCompletion}),
    openapi_extra=STREAM_DOC,
    summary="Create a chat completion",
)
async def chat_completions(request: HttpRequest, response: HttpResponse, payload: ChatCompletionRequest):
    """OpenAI's chat completion, answered by the appliance's model as a chat job on the decode
    queue. Not supported, and refused with 400 naming the field: `n` > 1, tools and function
    calling, non-text content parts, `response_format` other than text, log probabilities,
    `logit_bias`, `presence_penalty`. 404: an unknown `model`; 409: the job was cancelled;
    502: the job failed; 429: the decode queue is full, or you have as many jobs waiting as one
    person may (see `Retry-After`); 503: the broker does not answer, nothing was queued (see
    `Retry-After`). The body carries the
    appliance's measurements in `appliance`, and `X-Appliance-Job-Id` names the job. If a client
    waiting for a whole answer disconnects, the job is cancelled (a hang-up in the middle of a
    stream is not reported by the web server before the stream ends)."""
    model = model_or_404(payload.model)["id"]
    chat = chat_request(payload)
    # A stream's slot is taken before its job is queued: at the limit, nothing is queued.
    slot = await streaming.take_stream_slot(request.user.pk, api_token=request.api_token) if chat.stream else None
    try:
        job = await sync_to_async(services.job_create_chat)(
            owner=request.user, api_token=request.api_token, **chat.job_options
        )
    except BaseException:
        await streaming.release_stream_slot(request.user.pk, slot)  # nothing will stream on it
        raise
    if chat.stream:
        return _stream(job, chat, model, user_id=request.user.pk, slot=slot)
    job = await _wait_for(job)
    if job.state != Job.State.SUCCEEDED:
        raise unfinished_problem(job)
    response[JOB_ID_HEADER] = str(job.pk)
    return chat_completion(job, model=model)
