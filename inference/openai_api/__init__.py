"""The OpenAI-compatible endpoints (``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``), so that the official ``openai`` clients, vLLM's own bench client and the
tools built on them work against the appliance unchanged.

A chat completion is an ordinary chat job (``services.job_create_chat``): it waits in the decode
queue, runs on the same engine host as everything else, counts in its token's usage and records
its metrics. The operation waits for the job by reading the job's event stream (``streaming``),
and either answers with the whole ``chat.completion`` or relays the deltas as
``chat.completion.chunk`` server-sent events. A completion (``/v1/completions``) is a chat job
with a raw prompt: no chat template around it, its answer kept and sent exactly as written
(``text_completion``). A client that goes away cancels its job, which frees the engine.

What the engine cannot do is refused with a 400 that names the field (tools, images, ``n`` > 1,
a JSON schema xgrammar cannot read), never ignored: a client must not believe it got what it did
not. A ``response_format`` of ``json_object`` or ``json_schema`` holds the answer to it by the
engine's guided decoding (``inference.structured``). Fields the appliance has no use for
(``user``, ``metadata``, ``store``, unknown ones) are ignored.
"""

from __future__ import annotations

from inference.openai_api.relay import KEEPALIVE_MS, StreamDiverged, StreamedText
from inference.openai_api.routes import router
from inference.openai_api.schemas import JOB_ID_HEADER, ChatCompletionRequest, CompletionRequest
from inference.openai_api.served import served_model_id
from inference.openai_api.translation import (
    chat_completion,
    chat_request,
    completion_request,
    error_event,
    text_completion,
    unfinished_problem,
)

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "JOB_ID_HEADER",
    "KEEPALIVE_MS",
    "StreamDiverged",
    "StreamedText",
    "chat_completion",
    "chat_request",
    "completion_request",
    "error_event",
    "router",
    "served_model_id",
    "text_completion",
    "unfinished_problem",
]
