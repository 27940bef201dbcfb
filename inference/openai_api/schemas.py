"""The request and response shapes of ``/v1`` (django-ninja schemas), as OpenAI's API has them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import WithJsonSchema

from inference import services

STOP_SEQUENCES_MAX = 4  # as OpenAI


JOB_ID_HEADER = "X-Appliance-Job-Id"


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


class GenerationRequest(Schema):
    """What a chat completion and a completion request share: the model, sampling (OpenAI's and
    vLLM's extensions, as ``vllm serve`` reads them) and streaming."""

    model: str = Field(..., description="The id of a model from GET /v1/models.")
    temperature: float | None = Field(None, ge=0, le=2, description="Default 1, as OpenAI's.")
    top_p: float | None = Field(None, gt=0, le=1, description="Default 1.")
    seed: int | None = Field(None, ge=-(2**63), lt=2**63, description="Makes sampling repeatable.")
    stop: Stop = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Default 0.")
    presence_penalty: float | None = Field(
        None, ge=-2, le=2, description="Default 0; > 0 discourages any token the answer already has."
    )
    n: int | None = Field(None, description="Only 1.")
    logit_bias: dict[str, float] | None = Field(
        None,
        description="Token id (as a string) to a bias from -100 to 100 added to its logit; at most 300 tokens. "
        "An id outside the model's vocabulary fails the job with the engine's message.",
    )
    stream: bool | None = Field(False, description="Answer with server-sent events.")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="Accepted and ignored.")
    ignore_eos: bool = Field(
        False,
        description="vLLM's extension: write exactly `max_tokens` tokens, past the end of the answer (for load tests).",
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="vLLM's extension: > 1 discourages the prompt's and the answer's tokens; default 1.",
    )
    top_k: int | None = Field(
        None, ge=-1, description="vLLM's extension: sample among the k likeliest tokens; 0 or -1 (default): all."
    )
    min_p: float | None = Field(
        None, ge=0, le=1, description="vLLM's extension: only tokens at least this share of the likeliest's chance."
    )
    min_tokens: int | None = Field(
        None,
        ge=0,
        le=services.CHAT_MAX_TOKENS_LIMIT,
        description="vLLM's extension: the answer does not end (the model's end or a stop) before this many tokens.",
    )
    response_format: dict[str, Any] | None = Field(
        None,
        description='{"type": "text"} (the default); {"type": "json_object"}: the answer is a JSON object; '
        '{"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}}: the answer matches the schema '
        "(the engine's guided decoding, as `vllm serve`'s). At most 32 KiB of schema.",
    )
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's extension: not supported (ask for JSON with `response_format`)."
    )


class ChatCompletionRequest(GenerationRequest):
    """OpenAI's chat completion request. Unknown fields are ignored."""

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
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported.")
    tool_choice: ToolChoice = Field(None, description='Only "none".')
    functions: list[dict[str, Any]] | None = Field(None, description="Not supported.")
    function_call: ToolChoice = Field(None, description='Only "none".')
    logprobs: bool | None = Field(None, description="Not supported.")
    top_logprobs: int | None = Field(None, description="Not supported.")


Prompt = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1}],
            "description": "The text to continue, as written: no chat template goes around it. One prompt a "
            "request (a list of one text is accepted); prompts as token ids are refused.",
        }
    ),
]

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for a completion


class CompletionRequest(GenerationRequest):
    """OpenAI's (legacy) completion request: a raw prompt continued as written, with no chat
    template, as ``vllm serve`` answers it (the default endpoint of vLLM's own ``vllm bench
    serve``). Unknown fields are ignored."""

    prompt: Prompt = None
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=services.CHAT_MAX_TOKENS_LIMIT,
        description=f"The most tokens to write (default {COMPLETION_DEFAULT_MAX_TOKENS}, as OpenAI's); "
        "the KV cache is reserved for them.",
    )
    best_of: int | None = Field(None, description="Only 1.")
    echo: bool | None = Field(None, description="Only false (not supported).")
    suffix: str | None = Field(None, description="Not supported.")
    logprobs: int | None = Field(None, description="Not supported (not even 0).")


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


class _Choice(Schema):
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class CompletionChoice(_Choice):
    message: AssistantMessage


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


class _Answer(Schema):
    created: int
    model: str
    usage: Usage
    appliance: ApplianceMeasurements


class ChatCompletion(_Answer):
    id: str = Field(..., description="chatcmpl-<job id>")
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[CompletionChoice]


class TextChoice(_Choice):
    text: str


class TextCompletion(_Answer):
    id: str = Field(..., description="cmpl-<job id>")
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]


def _stream_doc(description: str, example: str) -> dict:
    """The 200 answer of a streaming operation: the JSON body, or server-sent events."""
    return {
        "responses": {
            200: {
                "description": description,
                "headers": {
                    JOB_ID_HEADER: {"description": "The appliance job that answered.", "schema": {"type": "string"}}
                },
                "content": {"text/event-stream": {"schema": {"type": "string"}, "example": example}},
            }
        }
    }


STREAM_DOC = _stream_doc(
    "Without `stream`: the `chat.completion`. With `stream: true`: server-sent events, each "
    "`data: <chat.completion.chunk JSON>`. The first chunk leaves when the first token has been "
    'written, and carries the role with the first text (`{"role": "assistant", "content": '
    '"Dear"}`), so that a client times the first token from it; then the rest of the text as '
    "`content` deltas, the last of them with `finish_reason` (as vLLM's server sends it; in a chunk "
    "of its own only when the last step wrote no text), then (with `stream_options.include_usage`) "
    "a chunk with `usage` and no choices, then `data: [DONE]`. "
    "While the request waits in the queue or reads its prompt (or nothing arrives for 2 s), "
    "only a blank line keeps the connection open every 2 s: no chunk, and no SSE comment (some "
    "clients lose the messages after one). A job that fails or is cancelled ends "
    'the stream with `data: {"error": {...}}` (no `[DONE]`), before any chunk if it wrote '
    "nothing. Header `X-Appliance-Job-Id` names the job.",
    "\n"
    'data: {"id": "chatcmpl-…", "object": "chat.completion.chunk", "created": 1767225600, '
    '"model": "SmolLM2-135M-Instruct", "choices": [{"index": 0, "delta": {"role": '
    '"assistant", "content": "Dear"}, "logprobs": null, "finish_reason": null}]}\n\n'
    'data: {"id": "chatcmpl-…", …, "choices": [{"index": 0, "delta": {"content": " Sir"}, '
    '"logprobs": null, "finish_reason": "stop"}]}\n\n'
    "data: [DONE]\n\n",
)

TEXT_STREAM_DOC = _stream_doc(
    "Without `stream`: the `text_completion`, its text exactly as the model wrote it (leading "
    "space included). With `stream: true`: server-sent events, each `data: <text_completion JSON>` "
    "with one choice holding the next `text`; the first leaves when the first token has been "
    "written, the last carries `finish_reason`; then (with `stream_options.include_usage`) a chunk "
    "with `usage` and no choices, then `data: [DONE]`. Waiting, failures and cancellation are "
    "as for a chat completion's stream. Header `X-Appliance-Job-Id` names the job.",
    'data: {"id": "cmpl-…", "object": "text_completion", "created": 1767225600, "model": '
    '"SmolLM2-135M-Instruct", "choices": [{"index": 0, "text": " the", "logprobs": null, '
    '"finish_reason": null}]}\n\n'
    'data: {"id": "cmpl-…", …, "choices": [{"index": 0, "text": " king", "logprobs": null, '
    '"finish_reason": "length"}]}\n\n'
    "data: [DONE]\n\n",
)
