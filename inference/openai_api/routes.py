"""The ``/v1`` operations: list and get the model, create a chat completion."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from ninja import Router

from api.auth import READ, WRITE, signed_in_user
from api.problems import bad_field, responses
from inference import services, streaming
from inference.models import Job
from inference.openai_api.here import Engine, HereRun, engine_here
from inference.openai_api.relay import _stream, _wait_for
from inference.openai_api.schemas import (
    JOB_ID_HEADER,
    STREAM_DOC,
    TEXT_STREAM_DOC,
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    TextCompletion,
)
from inference.openai_api.served import model_or_404, served_model
from inference.openai_api.translation import (
    ChatRequest,
    chat_completion,
    chat_request,
    completion_request,
    text_completion,
    unfinished_problem,
)

router = Router()


# The operation ids the schema had before this module was split out of inference/openai_api.py:
# clients generated from the schema call them by these names.
OPERATION_IDS = {
    "models_list": "inference_openai_api_models_list",
    "models_get": "inference_openai_api_models_get",
    "chat_completions": "inference_openai_api_chat_completions",
    "completions": "inference_openai_api_completions",
}


@router.get(
    "/models",
    auth=READ,
    response=responses(403, 429, ok={200: ModelList}),
    summary="List the models",
    operation_id=OPERATION_IDS["models_list"],
)
def models_list(request: HttpRequest):
    """The model this appliance serves; pass its `id` as `model`."""
    return {"object": "list", "data": [served_model()]}


@router.get(
    "/models/{path:model}",
    auth=READ,
    response=responses(403, 404, 429, ok={200: ModelCard}),
    summary="Get a model",
    operation_id=OPERATION_IDS["models_get"],
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
    operation_id=OPERATION_IDS["chat_completions"],
)
async def chat_completions(request: HttpRequest, response: HttpResponse, payload: ChatCompletionRequest):
    """OpenAI's chat completion, answered by the appliance's model as a chat job on the decode
    queue. Not supported, and refused with 400 naming the field: `n` > 1, tools and function
    calling, non-text content parts, log probabilities. Besides OpenAI's sampling options
    (`logit_bias` too), vLLM's `top_k`, `min_p`, `repetition_penalty`, `min_tokens` and
    `ignore_eos` are read as `vllm serve` reads them. `response_format` `json_object` or
    `json_schema` holds the answer to JSON (to the schema) by guided decoding; a schema xgrammar
    cannot read is a 400 naming `response_format.json_schema.schema`, one with a keyword vLLM
    refuses (`multipleOf`, ...) a failed job (502). vLLM's `structured_outputs` is refused.
    404: an unknown `model`; 409: the job was cancelled; 502: the job failed; 429: the decode
    queue is full, or you have as many jobs waiting as one person may (see `Retry-After`); 503:
    the broker does not answer, nothing was queued (see `Retry-After`). The body carries the
    appliance's measurements in `appliance`, and `X-Appliance-Job-Id` names the job. If the
    client disconnects, waiting for a whole answer or in the middle of a stream, the job is
    cancelled."""
    return await _answer(request, response, model_or_404(payload.model)["id"], chat_request(payload))


@router.post(
    "/completions",
    auth=WRITE,
    response=responses(403, 404, 409, 429, 502, 503, ok={200: TextCompletion}),
    openapi_extra=TEXT_STREAM_DOC,
    summary="Create a completion",
    operation_id=OPERATION_IDS["completions"],
)
async def completions(request: HttpRequest, response: HttpResponse, payload: CompletionRequest):
    """OpenAI's (legacy) completion: the `prompt` continued as written, with no chat template
    around it, as a chat job on the decode queue (what `vllm serve` answers here, and the
    endpoint vLLM's own `vllm bench serve` calls by default). The text comes back exactly as
    the model wrote it, leading space included. `max_tokens` defaults to 16, as OpenAI's. Not
    supported, and refused with 400 naming the field: more than one prompt, prompts as token ids,
    `n` or `best_of` > 1, `echo`, `suffix`, `logprobs` (0 too). The sampling options,
    `response_format`, the other answers, the measurements in `appliance`, the job's header and a
    client that disconnects are as for a chat completion."""
    return await _answer(request, response, model_or_404(payload.model)["id"], completion_request(payload))


async def _answer(request: HttpRequest, response: HttpResponse, model: str, chat: ChatRequest):
    """Queue the chat job for ``chat`` (or run it in this process, when its queue would start it
    at once: ``here``) and answer with its stream or, once it has finished, its whole completion."""
    # A stream's slot is taken before its job is queued: at the limit, nothing is queued.
    slot = (
        await streaming.take_stream_slot(request.user.pk, api_token=getattr(request, "api_token", None))
        if chat.stream
        else None
    )

    def create() -> tuple[Job, Engine | None]:
        engine = engine_here()
        try:
            job = services.job_create_chat(
                owner=signed_in_user(request),
                api_token=getattr(request, "api_token", None),
                claim_for=engine.key if engine else "",
                **chat.job_options,
            )
        except services.JobRejected as exc:
            if exc.field == "json_schema":  # the service's argument is the request's schema
                raise bad_field("response_format.json_schema.schema", str(exc)) from None
            raise
        return job, engine

    try:
        job, engine = await sync_to_async(create)()
    except BaseException:
        await streaming.release_stream_slot(request.user.pk, slot)  # nothing will stream on it
        raise
    # Claimed as it was created (the queue would have started it at once): run here.
    here = HereRun(job.pk, engine) if engine and job.state == Job.State.RUNNING else None
    if chat.stream:
        return _stream(job, chat, model, user_id=request.user.pk, slot=slot, here=here)
    job = await _wait_for(job, here)
    if job.state != Job.State.SUCCEEDED:
        raise unfinished_problem(job)
    response[JOB_ID_HEADER] = str(job.pk)
    return text_completion(job, model=model) if chat.raw else chat_completion(job, model=model)
