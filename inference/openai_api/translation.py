"""A chat completion or completion request into the appliance's chat job, and a finished job
into OpenAI's answer (pure: no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from api.problems import ApiProblem, bad_field
from inference.job_options import ChatOptions, storable_text
from inference.job_results import ChatResult
from inference.models import Job
from inference.openai_api.schemas import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    JOB_ID_HEADER,
    STOP_SEQUENCES_MAX,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    GenerationRequest,
)
from inference.sampling import LOGIT_BIAS_KEYS, NO_EXTRAS, SamplingExtras
from inference.structured import SchemaRefused, response_schema

EXTRAS = tuple(f.name for f in fields(SamplingExtras))

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class ChatRequest:
    """An OpenAI request in the appliance's terms: ``job_options`` are ``job_create_chat``'s."""

    job_options: dict[str, Any]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    raw: bool = False  # a completion of a raw prompt (``text_completion``), not a chat completion


def chat_request(payload: ChatCompletionRequest) -> ChatRequest:
    """Check what pydantic cannot and translate; raises a 400 ``ApiProblem`` naming the field."""
    for name in ("tools", "functions"):
        if getattr(payload, name):
            raise bad_field(name, "tools and function calling are not supported by this appliance.")
    for name in ("tool_choice", "function_call"):
        if getattr(payload, name) not in (None, "none"):
            raise bad_field(name, 'tools and function calling are not supported by this appliance; only "none".')
    if payload.logprobs or payload.top_logprobs:
        raise bad_field("logprobs" if payload.logprobs else "top_logprobs", "log probabilities are not supported.")
    _refuse_unsupported(payload)

    options: dict[str, Any] = {"messages": [chat_message(m, f"messages.{i}") for i, m in enumerate(payload.messages)]}
    max_tokens = payload.max_completion_tokens if payload.max_completion_tokens is not None else payload.max_tokens
    if max_tokens is not None:
        options["max_tokens"] = max_tokens  # else job_create_chat's default
    return _with_sampling(options, payload)


def completion_request(payload: CompletionRequest) -> ChatRequest:
    """A ``/v1/completions`` request as a chat job with a raw prompt (``ChatRequest.raw``);
    raises a 400 ``ApiProblem`` naming the field for what the appliance cannot do."""
    if payload.best_of not in (None, 1):
        raise bad_field("best_of", "only best_of=1 is supported: the appliance writes one answer per request.")
    if payload.echo:
        raise bad_field("echo", "echo is not supported: the answer holds only what the model wrote.")
    if payload.suffix:
        raise bad_field("suffix", "suffix (text to insert before) is not supported.")
    if payload.logprobs is not None:  # 0 still asks for the chosen token's log probability
        raise bad_field("logprobs", "log probabilities are not supported.")
    _refuse_unsupported(payload)
    options: dict[str, Any] = {"prompt": prompt_text(payload.prompt)}
    options["max_tokens"] = COMPLETION_DEFAULT_MAX_TOKENS if payload.max_tokens is None else payload.max_tokens
    return _with_sampling(options, payload, raw=True)


def _refuse_unsupported(payload: GenerationRequest) -> None:
    """What neither endpoint does, refused with a 400 naming the field."""
    if payload.n not in (None, 1):
        raise bad_field("n", "only n=1 is supported: the appliance writes one choice per request.")
    if payload.structured_outputs is not None:
        raise bad_field(
            "structured_outputs", "vLLM's structured_outputs is not supported; ask for JSON with response_format."
        )


def prompt_text(prompt: Any) -> str:
    """A completion's prompt: a text, or a list holding one."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise bad_field("prompt", "one prompt a request: send each prompt as a request of its own.")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        raise bad_field("prompt", "prompts as token ids are not supported; send the text.")
    if not isinstance(prompt, str) or not prompt:
        raise bad_field("prompt", "must be a non-empty text.")
    return prompt


def _with_sampling(options: dict[str, Any], payload: GenerationRequest, *, raw: bool = False) -> ChatRequest:
    """The sampling and streaming options both endpoints share, with OpenAI's defaults."""
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
    # OpenAI's presence_penalty and vLLM's extensions, as ``vllm serve`` reads them (a value out
    # of range is refused by the schema or, against max_tokens, by ``job_create_chat``).
    try:
        extras = SamplingExtras.from_json(
            {name: getattr(payload, name) for name in EXTRAS if getattr(payload, name) is not None}
        )
    except ValueError:  # the only option read from text: logit_bias's keys
        raise bad_field("logit_bias", LOGIT_BIAS_KEYS) from None
    if extras != NO_EXTRAS:
        options["extras"] = extras
    try:
        schema = response_schema(payload.response_format)
    except SchemaRefused as exc:
        raise bad_field(exc.field, str(exc)) from None
    if schema is not None:
        options["json_schema"] = schema
    stream_options = payload.stream_options if payload.stream else None
    return ChatRequest(
        job_options=options,
        stream=bool(payload.stream),
        include_usage=bool(stream_options and stream_options.include_usage),
        continuous_usage=bool(stream_options and stream_options.continuous_usage_stats),
        raw=raw,
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
    if any(s != storable_text(s) for s in sequences):
        # Stored, such a sequence would become U+FFFD and stop on that instead of on what was asked.
        raise bad_field("stop", "a stop sequence may not hold a NUL character or a lone surrogate.")
    if len(sequences) > STOP_SEQUENCES_MAX:
        raise bad_field("stop", f"at most {STOP_SEQUENCES_MAX} stop sequences.")
    return sequences


def finish_reason(job: Job) -> str:
    """Why the answer ended, as the engine said ("stop": its end or a stop sequence; "length":
    ``max_tokens``); for a job stored before the engine's reason was kept, from the count."""
    said = ChatResult.from_json(job.result_data or {}).finish_reason
    if said in ("stop", "length"):
        return said
    metrics = getattr(job, "metrics", None)
    written = metrics.output_tokens if metrics else 0
    return "length" if written >= ChatOptions.from_json(job.options).max_tokens else "stop"


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


def completion_id(job: Job, *, raw: bool = False) -> str:
    return f"cmpl-{job.pk}" if raw else f"chatcmpl-{job.pk}"


def text_completion(job: Job, *, model: str) -> dict[str, Any]:
    """A finished raw-prompt job as OpenAI's ``text_completion``."""
    return _completion(job, model, "text_completion", {"text": job.result_text})


def chat_completion(job: Job, *, model: str) -> dict[str, Any]:
    return _completion(job, model, "chat.completion", {"message": {"role": "assistant", "content": job.result_text}})


def _completion(job: Job, model: str, kind: str, answer: dict[str, Any]) -> dict[str, Any]:
    choice = {"index": 0, **answer, "logprobs": None, "finish_reason": finish_reason(job)}
    return {
        "id": completion_id(job, raw=kind == "text_completion"),
        "object": kind,
        "created": int(job.created_at.timestamp()),
        "model": model,
        "choices": [choice],
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
