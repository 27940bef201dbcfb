"""The OpenAI-compatible endpoints (``inference/openai_api/``).

Unit tests: translating a request (pure), what is refused with a 400 naming the field, models,
auth and the schema, through Django's test client where no engine is needed. The integration
test drives the official ``openai`` client, unchanged, against the live appliance: real web
server, workers, engine host and model."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import aclosing

import openai
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import Client
from django.utils import timezone

from api.problems import ApiProblem
from api.services import token_create
from api.site import api
from inference import openai_api, services
from inference.attempts import RECORDED
from inference.engine.protocol import GenerateRequest
from inference.job_results import ChatResult
from inference.models import Job, JobKind, Queue, RequestMetrics
from inference.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamDiverged,
    StreamedText,
    chat_request,
    completion_request,
    relay,
)
from inference.openai_api.translation import finish_reason
from inference.running import engine_request
from inference.sampling import NO_EXTRAS, SamplingExtras
from tests.conftest import wait_until

MODEL = openai_api.served_model_id()
HELLO = [{"role": "user", "content": "Say hello."}]
# Raw prompts for the live engine: a story to continue, and a question the model answers in a
# few tokens.
STORY = "Once upon a time, in a small town by the sea, there lived"
SHORT_ANSWER = "Question: Is the sky blue? Answer yes or no.\nAnswer:"


def _translate(**body):
    return chat_request(ChatCompletionRequest(**{"model": MODEL, "messages": HELLO, **body}))


def _refused_field(**body) -> str:
    with pytest.raises(ApiProblem) as refused:
        _translate(**body)
    assert refused.value.status == 400
    return refused.value.errors[0]["field"]


# --- translating a request (pure) ------------------------------------------------------------


def test_text_parts_are_joined_and_developer_is_a_system_message():
    chat = _translate(
        messages=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Dear Sir,"}, {"type": "text", "text": "rent?"}]},
            {"role": "assistant", "content": "Yes.", "name": "clerk"},
        ]
    )
    assert chat.job_options["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Dear Sir,\nrent?"},
        {"role": "assistant", "content": "Yes."},
    ]


def test_max_completion_tokens_wins_over_max_tokens_and_neither_leaves_the_service_default():
    assert _translate(max_tokens=100, max_completion_tokens=20).job_options["max_tokens"] == 20
    assert _translate(max_tokens=100).job_options["max_tokens"] == 100
    assert "max_tokens" not in _translate().job_options


def test_sampling_options_are_translated_with_openais_defaults():
    chat = _translate(top_p=0.9, seed=7, stop="\n\n", frequency_penalty=0.5, user="u-1", metadata={"x": 1})
    assert chat.job_options["temperature"] == 1.0  # OpenAI's default when none is sent
    assert chat.job_options["top_p"] == 0.9 and chat.job_options["seed"] == 7
    assert chat.job_options["stop"] == ["\n\n"] and chat.job_options["frequency_penalty"] == 0.5
    explicit = _translate(temperature=0, stop=["a", "b"]).job_options
    assert (explicit["temperature"], explicit["stop"]) == (0, ["a", "b"])
    assert not _translate().stream and not _translate(stream_options={"include_usage": True}).include_usage
    streamed = _translate(stream=True, stream_options={"include_usage": True})
    assert streamed.stream and streamed.include_usage and not streamed.continuous_usage
    assert _translate(stream=True, stream_options={"continuous_usage_stats": True}).continuous_usage
    assert "ignore_eos" not in _translate().job_options and _translate(ignore_eos=True).job_options["ignore_eos"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"logprobs": True}, "logprobs"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
        ),
        ({"messages": [HELLO[0], {"role": "user", "content": 5}]}, "messages.1.content"),
        ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}]}, "messages.0.tool_calls"),
    ],
)
def test_what_the_appliance_cannot_do_is_refused_naming_the_field(body, field):
    assert _refused_field(**body) == field


def test_the_defaults_of_refused_features_are_accepted():
    chat = _translate(n=1, tools=[], tool_choice="none", response_format={"type": "text"})
    assert chat.job_options["messages"] == HELLO


def test_presence_penalty_and_vllms_sampling_extensions_reach_the_job_as_vllm_reads_them():
    chosen = _translate(presence_penalty=0.5, repetition_penalty=1.2, top_k=40, min_p=0.05, min_tokens=3)
    assert chosen.job_options["extras"] == SamplingExtras(
        presence_penalty=0.5, repetition_penalty=1.2, top_k=40, min_p=0.05, min_tokens=3
    )
    assert _translate(top_k=5).job_options["extras"] == SamplingExtras(top_k=5)
    # Their values that change nothing, as a bench client sends them: no options at all, and -1
    # is vLLM's other way of saying top_k "every token".
    for body in ({"top_k": -1}, {"top_k": 0}, {"min_p": 0}, {"min_tokens": 0}, {"repetition_penalty": 1.0}, {}):
        assert "extras" not in _translate(**body).job_options
    assert _translate_completion(top_k=1, min_tokens=2).job_options["extras"] == SamplingExtras(top_k=1, min_tokens=2)
    # OpenAI's logit_bias: token ids as text keys, kept by id.
    biased = _translate(logit_bias={"50256": -100, "13": 2.5}).job_options["extras"]
    assert biased == SamplingExtras(logit_bias=((13, 2.5), (50256, -100.0)))
    assert "extras" not in _translate(logit_bias={}).job_options


def test_a_response_format_of_json_holds_the_answer_to_a_schema_as_vllm_reads_it():
    schema = {"type": "object", "properties": {"party": {"enum": ["landlord", "tenant"]}}, "required": ["party"]}
    named = {"type": "json_schema", "json_schema": {"name": "party", "strict": True, "schema": schema}}
    assert _translate(response_format=named).job_options["json_schema"] == schema
    # "json_object" is any JSON object, as vLLM compiles it; "text" (and no format) is free text.
    assert _translate(response_format={"type": "json_object"}).job_options["json_schema"] == {"type": "object"}
    assert "json_schema" not in _translate(response_format={"type": "text"}).job_options
    assert "json_schema" not in _translate().job_options
    # The same on a completion, as vllm serve reads it there too.
    assert _translate_completion(response_format=named).job_options["json_schema"] == schema


def test_the_finish_reason_is_the_engines_and_older_rows_infer_it_from_the_count():
    job = _finished(output_tokens=16, max_tokens=16)
    assert finish_reason(job) == "length"  # a row of before: written as many as allowed
    job.result_data = ChatResult(finish_reason="stop").to_json()  # the model ended on its last allowed token
    assert finish_reason(job) == "stop" and ChatResult.from_json(job.result_data).finish_reason == "stop"
    job = _finished(output_tokens=3, max_tokens=16)
    job.result_data = {"finish_reason": "length"}
    assert finish_reason(job) == "length"


def _translate_completion(**body):
    return completion_request(CompletionRequest(**{"model": MODEL, "prompt": "Once upon a time", **body}))


def test_a_completion_is_a_chat_job_of_the_raw_prompt_with_openais_defaults():
    text = _translate_completion()
    assert text.raw and not text.stream
    # No messages: the prompt is continued as written, with no chat template around it.
    assert text.job_options == {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0}
    assert _translate_completion(prompt=["Dear Sir,"]).job_options["prompt"] == "Dear Sir,"
    chosen = _translate_completion(max_tokens=40, temperature=0, top_p=0.5, seed=3, stop="\n", ignore_eos=True)
    assert chosen.job_options == {
        "prompt": "Once upon a time",
        "max_tokens": 40,
        "temperature": 0,
        "top_p": 0.5,
        "seed": 3,
        "stop": ["\n"],
        "ignore_eos": True,
    }
    streamed = _translate_completion(stream=True, stream_options={"include_usage": True})
    assert streamed.stream and streamed.include_usage and streamed.raw
    # What vLLM's bench client sends by default (``vllm bench serve``, backend "openai").
    bench = _translate_completion(repetition_penalty=1.0, logprobs=None, stream=True, n=1, best_of=1, echo=False)
    assert bench.raw and bench.job_options["prompt"] == "Once upon a time"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [101, 2023]}, "prompt"),
        ({"prompt": [[101, 2023]]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"suffix": "The end."}, "suffix"),
        ({"logprobs": 2}, "logprobs"),
        ({"logprobs": 0}, "logprobs"),  # still the chosen token's log probability
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": "\x00"}, "stop"),  # stored it would be U+FFFD, and stop on that
    ],
)
def test_what_a_completion_cannot_do_is_refused_naming_the_field(body, field):
    with pytest.raises(ApiProblem) as refused:
        _translate_completion(**body)
    assert refused.value.status == 400 and refused.value.errors[0]["field"] == field


# --- the streamed text -----------------------------------------------------------------------


def test_the_stream_sends_what_the_job_stores_without_outer_whitespace():
    text = StreamedText()
    sent = [text.add(delta) for delta in ["  Dear", " Sir, ", " \n", "thank you.", "\n"]]
    assert sent == ["Dear", " Sir,", "", "  \nthank you.", ""]
    assert text.sent == "  Dear Sir,  \nthank you.\n".strip()
    assert text.rest("Dear Sir,  \nthank you.") == ""
    assert text.rest("Dear Sir,  \nthank you. More") == " More"


def test_a_raw_completion_streams_its_text_as_written_whitespace_and_all():
    text = StreamedText(verbatim=True)
    sent = [text.add(delta) for delta in [" upon", " a time", "\n", "there was"]]
    assert sent == [" upon", " a time", "\n", "there was"]
    assert text.rest(" upon a time\nthere was") == "" and text.rest(" upon a time\nthere was\n") == "\n"


def test_a_raw_completions_stream_is_text_completion_chunks_with_no_role(monkeypatch):
    done = _finished()
    done.options = {"prompt": "Once upon a time", "max_tokens": 16, "messages": []}
    done.result_text = " upon a hill\n"
    events = [
        ("keepalive", {}),
        ("delta", {"text": " upon", "tokens": 1}),
        ("delta", {"text": " a hill\n", "tokens": 15}),
    ]
    chat = _translate_completion(stream=True, stream_options={"include_usage": True})
    parts, cancelled = _streamed(monkeypatch, events, done, chat=chat)
    assert parts[0] == "\n" and parts[-1] == "data: [DONE]\n\n"
    chunks = _chunks(parts)
    assert {c["object"] for c in chunks} == {"text_completion"} and {c["id"] for c in chunks} == {f"cmpl-{done.pk}"}
    # Each chunk's text as written (the leading space and the newline are the model's), then the
    # finish, then the usage with no choice.
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == [" upon", " a hill\n", ""]
    assert all("delta" not in c["choices"][0] for c in chunks[:-1])
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert not cancelled


def test_the_finish_goes_with_the_last_text_as_vllms_server_sends_it(monkeypatch):
    """The engine's last delta says why it ended: its chunk carries the finish, and no empty
    finish chunk follows (vLLM's bench client would count it as one more inter-token gap); the
    measurements ride on the usage chunk instead."""
    events = [
        ("delta", {"text": "Dear", "tokens": 1}),
        ("delta", {"text": " Sir, thank you.", "tokens": 15, "finish_reason": "length"}),
    ]
    parts, _ = _streamed(monkeypatch, events, _finished(), include_usage=True)
    chunks = _chunks(parts)
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": "Dear"},
        {"content": " Sir, thank you."},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert chunks[-1]["appliance"]["ttft_ms"] == 56.8 and parts[-1] == "data: [DONE]\n\n"
    # A completion's text chunks alike: as many chunks as deltas, the last with its finish.
    raw = _finished()
    raw.options, raw.result_text = {"prompt": "Once", "max_tokens": 16, "messages": []}, " upon a time"
    chat = _translate_completion(stream=True)
    parts, _ = _streamed(monkeypatch, [("delta", {"text": " upon", "tokens": 1}),
                                       ("delta", {"text": " a time", "tokens": 15, "finish_reason": "stop"})],
                         raw, chat=chat)  # fmt: skip
    texts = [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in _chunks(parts)]
    assert texts == [(" upon", None), (" a time", "stop")]


def test_a_restarted_job_resends_nothing_it_already_sent_unless_it_differs():
    text = StreamedText()
    assert text.add("Hello wor") == "Hello wor"
    text.restart()
    assert text.add("Hel") == "" and text.add("lo wor") == "" and text.add("ld") == "ld"
    text.restart()
    with pytest.raises(StreamDiverged):
        text.add("Goodbye")


# --- answering (pure) ------------------------------------------------------------------------


def _finished(state=Job.State.SUCCEEDED, *, output_tokens=16, max_tokens=16, error="") -> Job:
    options = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens}  # as a chat job's row
    job = Job(kind=JobKind.CHAT, queue=Queue.DECODE, state=state, options=options, error=error)
    job.created_at = timezone.now()
    job.result_text = "Dear Sir, thank you."
    job.metrics = RequestMetrics(
        prompt_tokens=30,
        output_tokens=output_tokens,
        queue_wait_ms=12.34,
        admission_wait_ms=0,
        ttft_ms=56.78,
        decode_tokens_per_s=None,
        kv_reservation_tokens=46,
    )
    return job


def test_a_completion_says_why_it_stopped_and_what_it_used():
    completion = openai_api.chat_completion(_finished(output_tokens=16, max_tokens=16), model=MODEL)
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "Dear Sir, thank you."}
    assert completion["usage"] == {"prompt_tokens": 30, "completion_tokens": 16, "total_tokens": 46}
    assert completion["appliance"] | {"job_id": None} == {
        "job_id": None,
        "queue_wait_ms": 12.3,
        "ttft_ms": 56.8,
        "decode_tokens_per_s": None,
    }
    assert completion["id"] == f"chatcmpl-{completion['appliance']['job_id']}"
    assert openai_api.chat_completion(_finished(output_tokens=9), model=MODEL)["choices"][0]["finish_reason"] == "stop"


def test_a_cancelled_job_is_409_not_to_retry_and_a_failed_one_502_with_its_reason():
    cancelled = openai_api.unfinished_problem(_finished(Job.State.CANCELLED))
    assert (cancelled.status, cancelled.code, cancelled.headers["x-should-retry"]) == (409, "conflict", "false")
    failed = openai_api.unfinished_problem(_finished(Job.State.FAILED, error="The engine refused this job: too long"))
    assert failed.status == 502 and failed.detail.endswith("The engine refused this job: too long")
    assert openai_api.JOB_ID_HEADER in failed.headers
    event = openai_api.error_event(failed)
    assert event.startswith('data: {"error": {"message": "The model could not answer') and event.endswith("}}\n\n")


# --- the streamed chunks, from a fake of the job's event stream --------------------------------


def _streamed(monkeypatch, events, done: Job, *, chat=None, **stream_options) -> tuple[list[str], list]:
    """What ``_stream`` sends, part by part, for a job whose event stream is ``events`` (a fake
    of ``_job_events``) and that ends as ``done``; and the jobs it cancelled. ``chat``: the
    translated request (default: a streamed chat completion with ``stream_options``)."""
    cancelled = []

    async def job_events(job, here=None):
        for event in events:
            yield event

    async def finished_job(job_id):
        return done

    async def cancel(job):
        cancelled.append(job)

    monkeypatch.setattr(relay, "_job_events", job_events)
    monkeypatch.setattr(relay, "_finished_job", finished_job)
    monkeypatch.setattr(relay, "_cancel", cancel)
    chat = chat or _translate(stream=True, stream_options=stream_options or None)
    response = relay._stream(done, chat, MODEL)

    async def parts() -> list[str]:
        return [part.decode() async for part in response.streaming_content]

    return asyncio.run(parts()), cancelled


def _chunks(parts: list[str]) -> list[dict]:
    return [json.loads(p.removeprefix("data: ")) for p in parts if p.startswith("data: {")]


def test_the_first_chunk_leaves_with_the_first_token_and_carries_the_role(monkeypatch):
    events = [
        ("keepalive", {}),
        ("keepalive", {}),
        ("delta", {"text": "Dear", "tokens": 1, "times": [[100.0, 1]], "prompt_tokens": 30}),
        ("delta", {"text": " Sir, thank you.", "tokens": 15, "times": [[100.1, 15]]}),
    ]
    parts, cancelled = _streamed(monkeypatch, events, _finished(), include_usage=True, continuous_usage_stats=True)
    # While the job waits and reads its prompt, only blank lines: no chunk a client would time.
    assert parts[:2] == ["\n"] * 2 and parts[-1] == "data: [DONE]\n\n"
    chunks = _chunks(parts[2:])
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": "Dear"},
        {"content": " Sir, thank you."},
        {},
    ]
    first = chunks[0]
    assert first["usage"]["completion_tokens"] == 1 and first["appliance"]["token_times"] == [[100.0, 1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert not cancelled


def test_vllms_bench_client_reads_every_chunk_of_a_stream_that_waited(monkeypatch):
    """vLLM's own bench client (``vllm bench serve``), reading one part per network read as it
    does (it strips each read): a stream that waited for its first token and paused mid-way still
    gives it every chunk. With an SSE comment as the keepalive it got none after the first
    comment, and counted the request failed ("Never received a valid chunk")."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    events = [
        ("keepalive", {}),
        ("keepalive", {}),
        ("delta", {"text": "Dear", "tokens": 1}),
        ("keepalive", {}),  # a long step of another request: nothing for 2 s
        ("delta", {"text": " Sir, thank you.", "tokens": 15}),
    ]
    parts, _ = _streamed(monkeypatch, events, _finished(), include_usage=True)
    handler, messages = StreamedResponseHandler(), []
    for part in parts:
        read = part.encode().strip()
        if read:  # the client skips an empty read before its parser sees it
            messages += handler.add_chunk(read)
    data = [json.loads(m.removeprefix("data: ")) for m in messages if m != "data: [DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in data if c["choices"]) == "Dear Sir, thank you."
    assert data[-1]["usage"]["completion_tokens"] == 16 and messages[-1] == "data: [DONE]"


def test_a_first_token_of_whitespace_still_leaves_at_once_as_the_role(monkeypatch):
    # The stored answer has no leading whitespace, so its text is held back; the chunk is not.
    events = [
        ("keepalive", {}),
        ("delta", {"text": "\n", "tokens": 1}),
        ("keepalive", {}),
        ("delta", {"text": "Dear Sir, thank you.", "tokens": 15}),
    ]
    parts, _ = _streamed(monkeypatch, events, _finished())
    assert parts[0] == parts[2] == "\n"
    assert [c["choices"][0]["delta"] for c in _chunks([parts[1], *parts[3:]])] == [
        {"role": "assistant", "content": ""},
        {"content": "Dear Sir, thank you."},
        {},
    ]


def test_every_delta_leaves_as_a_chunk_when_it_arrives_even_whitespace_held_back(monkeypatch):
    # A client times a chunk per delta: whitespace waits for the next text (the stored answer
    # has none at its end), its chunk does not.
    done = _finished()
    done.result_text = "Dear\nSir, thank you."
    events = [
        ("delta", {"text": "Dear", "tokens": 1}),
        ("delta", {"text": "\n", "tokens": 1}),
        ("keepalive", {}),
        ("delta", {"text": "Sir, thank you.", "tokens": 4}),
    ]
    parts, _ = _streamed(monkeypatch, events, done)
    assert parts[2] == "\n"
    deltas = [c["choices"][0]["delta"] for c in _chunks(parts)]
    assert deltas == [{"role": "assistant", "content": "Dear"}, {"content": ""}, {"content": "\nSir, thank you."}, {}]
    assert _chunks(parts[:2])[1]["choices"][0]["delta"] == {"content": ""}  # before the keepalive
    assert "".join(d.get("content", "") for d in deltas) == done.result_text


def test_a_restarted_job_sends_no_chunk_until_it_has_caught_up(monkeypatch):
    events = [
        ("delta", {"text": "Dear Sir,", "tokens": 3}),
        ("restart", {}),
        ("delta", {"text": "Dear", "tokens": 1}),
        ("delta", {"text": " Sir,", "tokens": 2}),
        ("delta", {"text": " thank you.", "tokens": 3}),
    ]
    parts, _ = _streamed(monkeypatch, events, _finished())
    assert [c["choices"][0]["delta"] for c in _chunks(parts)] == [
        {"role": "assistant", "content": "Dear Sir,"},
        {"content": " thank you."},
        {},
    ]


@pytest.mark.django_db(transaction=True)
def test_a_job_silent_for_longer_than_the_brokers_read_timeout_keeps_its_stream(alice):
    # The job stays queued and writes nothing: it is on a queue no worker consumes from the start
    # (the session's decode workers may be running: one took a job made for theirs before it
    # could be moved). redis-py's client gives up reading after 5 s by default; an XREAD blocking
    # that long broke the request.
    job = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, celery_queue="nobody")

    async def keepalives_for(seconds: float) -> list[str]:
        seen, started = [], time.monotonic()
        try:
            async with aclosing(relay._job_events(job)) as events:
                async for event, _ in events:
                    seen.append(event)
                    if time.monotonic() - started > seconds:
                        return seen
            return seen
        finally:
            await sync_to_async(connections.close_all)()  # the job row's checks ran in that thread

    assert set(asyncio.run(keepalives_for(6.0))) == {"keepalive"}


@pytest.mark.django_db(transaction=True)
def test_a_job_run_here_is_relayed_from_its_attempt_then_from_the_broker_where_it_went_on(alice, monkeypatch):
    """A /v1 job the web process ran itself: its tokens as its attempt hands them over, a blank
    line while it is silent, and, once it was put back for a worker, the rest from the broker's
    stream after the last point the stream had recorded, not from its start (a token handed
    over but never recorded is followed by the next attempt's restart)."""
    from inference import streaming

    job = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, celery_queue="nobody")  # no worker's
    first = streaming.publish(job.pk, "delta", {"text": "Dear", "tokens": 1})  # the attempt here wrote it
    for event, data in [("waiting", {"reason": "engine_restarting"}), ("restart", {"attempt": 2}),
                        ("delta", {"text": "Dear supplier", "tokens": 2}), ("done", {})]:  # fmt: skip
        streaming.publish(job.pk, event, data)  # the engine died: put back, a worker went on
    monkeypatch.setattr(relay, "KEEPALIVE_MS", 100)

    class FakeHereRun:  # a fake of ``HereRun``: only its queue of events
        events: asyncio.Queue

    async def relayed() -> list[tuple[str, dict]]:
        here = FakeHereRun()
        here.events = asyncio.Queue()
        here.events.put_nowait(("", "delta", {"text": "Dear", "tokens": 1}))  # handed over at once
        here.events.put_nowait((first, RECORDED, {}))  # then recorded
        here.events.put_nowait(("", "delta", {"text": " sup", "tokens": 1}))  # the engine died before its batch
        asyncio.get_running_loop().call_later(0.3, here.events.put_nowait, None)  # silent, then it ends
        try:
            async with aclosing(relay._job_events(job, here)) as events:
                return [item async for item in events]
        finally:
            await sync_to_async(connections.close_all)()

    seen = asyncio.run(relayed())
    names = [event for event, _ in seen]
    assert names[:2] == ["delta", "delta"] and set(names[2 : names.index("waiting")]) == {"keepalive"}
    assert names[names.index("waiting") :] == ["waiting", "restart", "delta", "done"]
    assert [data["text"] for event, data in seen if event == "delta"] == ["Dear", " sup", "Dear supplier"]


def test_v1_runner_threads_are_kept_and_no_job_waits_for_another_to_end(settings):
    import threading

    from inference.openai_api.here import _Runners

    settings.APPLIANCE_DECODE_CONCURRENCY = 4
    runners = _Runners()
    release, started = threading.Event(), []

    def blocking():
        started.append(threading.current_thread())
        release.wait(30)

    runners.run(blocking)
    runners.run(blocking)
    wait_until(lambda: len(started) == 2, timeout_s=10, message="the second job started beside the first")
    assert started[0] is not started[1] and all(t.daemon for t in started)
    release.set()
    wait_until(lambda: runners._idle == 2, timeout_s=10, message="both threads back, waiting for work")
    ran_on = []
    for _ in range(3):  # one after another: on the threads already there
        done = threading.Event()
        runners.run(lambda done=done: (ran_on.append(threading.current_thread()), done.set()))
        assert done.wait(10)
    assert set(ran_on) <= set(started)


def test_a_job_that_writes_nothing_sends_the_role_with_its_finish_and_a_failure_no_chunk(monkeypatch):
    empty = _finished(output_tokens=0)
    empty.result_text = ""
    parts, _ = _streamed(monkeypatch, [("keepalive", {})], empty)
    (finish,) = _chunks(parts)
    assert finish["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert finish["choices"][0]["finish_reason"] == "stop"

    failed = _finished(Job.State.FAILED, error="the prompt is too long")
    parts, cancelled = _streamed(monkeypatch, [("keepalive", {})], failed, include_usage=True)
    assert parts == ["\n", openai_api.error_event(openai_api.unfinished_problem(failed))]
    assert not cancelled


# --- the service and the engine request ------------------------------------------------------


@pytest.mark.django_db
def test_chat_jobs_keep_the_sampling_options_and_send_them_to_the_engine(alice):
    job = services.job_create_chat(
        owner=alice, messages=HELLO, max_tokens=8, top_p=0.5, seed=3, stop=["END"], frequency_penalty=0.2
    )
    assert job.kind == JobKind.CHAT and job.queue == Queue.DECODE
    request = engine_request(job, job.options["messages"], 8, part="chat")
    assert (request.top_p, request.seed, request.stop, request.frequency_penalty) == (0.5, 3, ["END"], 0.2)
    plain = services.job_create_chat(owner=alice, messages=HELLO)
    assert not {"top_p", "seed", "stop", "frequency_penalty"} & plain.options.keys()
    request = engine_request(plain, HELLO, 512, part="chat")
    assert (request.top_p, request.seed, request.stop, request.extras) == (1.0, None, [], NO_EXTRAS)
    extras = SamplingExtras(presence_penalty=-0.5, repetition_penalty=1.3, top_k=20, min_p=0.1, min_tokens=4)
    job = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, extras=extras)
    job.refresh_from_db()
    assert job.options["top_k"] == 20 and job.options["min_tokens"] == 4  # in the row as vLLM names them
    request = engine_request(job, HELLO, 8, part="chat")
    assert request.extras == extras
    assert GenerateRequest.from_message(request.to_message()).extras == extras  # across the engine's wire


@pytest.mark.django_db
def test_a_sampled_request_sent_without_a_seed_draws_the_same_one_on_every_attempt(alice):
    """So that an attempt started again writes what the first was writing (a stream that sent
    part of it goes on to the stored answer), while each job still samples its own."""
    job = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=1.0)
    first = engine_request(job, HELLO, 8, part="chat").seed
    job.attempts, job.engine_crashes = 2, 1
    again = engine_request(job, HELLO, 8, part="chat")
    assert first is not None and again.seed == first and again.request_id != f"{job.pk}-1-chat"
    assert engine_request(job, HELLO, 8, part="c1").seed != first  # each part of a job its own
    other = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=1.0)
    assert engine_request(other, HELLO, 8, part="chat").seed != first  # each job its own
    given = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=1.0, seed=7)
    assert engine_request(given, HELLO, 8, part="chat").seed == 7
    greedy = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=0.0)
    assert engine_request(greedy, HELLO, 8, part="chat").seed is None  # nothing to draw
    # With a top-p or top-k filter a seeded request would send a GPU's whole batch off FlashInfer's
    # sampling kernels: not seeded (such a stream, restarted, may still end asking to send again).
    nucleus = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=1.0, top_p=0.9)
    assert engine_request(nucleus, HELLO, 8, part="chat").seed is None
    top_k = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, temperature=1.0,
                                     extras=SamplingExtras(top_k=20))  # fmt: skip
    assert engine_request(top_k, HELLO, 8, part="chat").seed is None


@pytest.mark.django_db
def test_a_chat_jobs_json_schema_is_kept_and_sent_to_the_engine_and_tried_again(alice):
    schema = {"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"]}
    job = services.job_create_chat(owner=alice, messages=HELLO, max_tokens=8, json_schema=schema)
    job.refresh_from_db()
    assert job.options["json_schema"] == schema
    request = engine_request(job, HELLO, 8, part="chat", json_schema=schema)
    assert GenerateRequest.from_message(request.to_message()).json_schema == schema  # across the engine's wire
    assert "json_schema" not in services.job_create_chat(owner=alice, messages=HELLO).options
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED)
    again = services.job_retry(job=Job.objects.get(pk=job.pk), user=alice)
    assert again.pk != job.pk and again.options["json_schema"] == schema
    with pytest.raises(services.JobRejected, match='Unsupported type "objectx"') as refused:
        services.job_create_chat(owner=alice, messages=HELLO, json_schema={"type": "objectx"})
    assert refused.value.field == "json_schema" and Job.objects.count() == 3  # job, plain, again: no fourth


@pytest.mark.django_db
def test_text_postgres_cannot_store_costs_a_character_not_the_request(alice):
    """A NUL (which a random benchmark prompt or a pasted binary fragment holds) or a lone
    surrogate (JSON's "\\ud800") in a message or a prompt: stored, and sent to the engine, as
    U+FFFD. Before, the job's row could not be written and the request was a 500."""
    chat = services.job_create_chat(owner=alice, messages=[{"role": "user", "content": "rent\x00due\ud800?"}])
    chat.refresh_from_db()
    assert chat.options["messages"] == [{"role": "user", "content": "rent\ufffddue\ufffd?"}]
    raw = services.job_create_chat(owner=alice, prompt="\x00\x00Once upon", max_tokens=4)
    raw.refresh_from_db()
    assert raw.options["prompt"] == "\ufffd\ufffdOnce upon"
    assert engine_request(raw, [], 4, part="chat", prompt=raw.options["prompt"]).prompt == "\ufffd\ufffdOnce upon"


@pytest.mark.django_db
def test_a_failed_raw_completion_tried_again_is_the_same_raw_prompt(alice):
    raw = services.job_create_chat(owner=alice, prompt=" Once upon", max_tokens=4, temperature=0.5, seed=9)
    Job.objects.filter(pk=raw.pk).update(state=Job.State.FAILED)
    again = services.job_retry(job=Job.objects.get(pk=raw.pk), user=alice)
    assert again.pk != raw.pk and again.options == raw.options
    assert again.options["prompt"] == " Once upon" and again.options["messages"] == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_p": 0.0}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"seed": True}, "seed"),
        ({"stop": ["a"] * 5}, "at most 4"),
        ({"stop": "END"}, "stop must be a list"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"extras": SamplingExtras(presence_penalty=-3.0)}, "presence_penalty"),
        ({"extras": SamplingExtras(repetition_penalty=float("nan"))}, "repetition_penalty"),
        ({"extras": SamplingExtras(top_k=-5)}, "top_k"),
        ({"extras": SamplingExtras(min_p=2.0)}, "min_p"),
        ({"extras": SamplingExtras(min_tokens=600)}, r"min_tokens \(600\) must not be more than max_tokens \(512\)"),
    ],
)
def test_the_service_refuses_bad_sampling_options(alice, options, message):
    with pytest.raises(services.JobRejected, match=message):
        services.job_create_chat(owner=alice, messages=HELLO, **options)
    assert not Job.objects.exists()


# --- through Django's test client (no engine) ------------------------------------------------


@pytest.fixture
def token(alice):
    return token_create(user=alice, name="openai client", scopes=["read", "write"])


@pytest.fixture
def api_client(token):
    return Client(headers={"Authorization": f"Bearer {token[1]}"})


def _chat(client, **body):
    return client.post(
        "/v1/chat/completions", {"model": MODEL, "messages": HELLO, **body}, content_type="application/json"
    )


@pytest.mark.django_db
def test_models_list_and_get(api_client):
    listed = api_client.get("/v1/models").json()
    assert listed["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [(MODEL, "model", "appliance")]
    assert isinstance(listed["data"][0]["created"], int)
    assert api_client.get(f"/v1/models/{MODEL}").json() == listed["data"][0]
    missing = api_client.get("/v1/models/gpt-4o")
    assert missing.status_code == 404 and "'gpt-4o'" in missing.json()["detail"]


@pytest.mark.django_db
def test_an_unknown_model_is_404_naming_it(api_client):
    response = _chat(api_client, model="gpt-4o")
    assert response.status_code == 404
    problem = response.json()
    assert problem["error"]["code"] == "not-found" and "'gpt-4o'" in problem["error"]["message"]
    assert MODEL in problem["detail"]  # and says which model it serves
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n": 2}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": services.CHAT_MAX_TOKENS_LIMIT + 1}, "max_completion_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),  # the service's check: against max_tokens
        ({"logit_bias": {"rent": 5}}, "logit_bias"),
        ({"logit_bias": {"-4": 5}}, "logit_bias"),
        ({"logit_bias": {"4": 150}}, "logit_bias"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages.0.content.0.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}},
            "response_format.json_schema.schema",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}] * (services.CHAT_MAX_MESSAGES + 1)}, "messages"),
    ],
)
def test_a_bad_request_is_400_naming_the_field_for_openai_clients(api_client, body, field):
    response = _chat(api_client, **body)
    assert response.status_code == 400
    problem = response.json()
    assert problem["errors"][0]["field"] == field
    assert problem["error"]["param"] == field and problem["error"]["message"].startswith(f"{field}: ")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_missing_token_is_401_and_a_read_only_token_may_list_models_but_not_chat(alice):
    anonymous = Client()
    assert _chat(anonymous).status_code == 401
    assert anonymous.get("/v1/models").status_code == 401
    _, raw = token_create(user=alice, name="reader", scopes=["read"])
    reader = Client(headers={"Authorization": f"Bearer {raw}"})
    assert reader.get("/v1/models").status_code == 200
    refused = _chat(reader)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient-scope"
    assert not Job.objects.exists()


def test_the_schema_documents_the_stream_and_every_error():
    operation = api.get_openapi_schema()["paths"]["/v1/chat/completions"]["post"]
    assert {"application/json", "text/event-stream"} <= operation["responses"][200]["content"].keys()
    assert {400, 401, 403, 404, 409, 429, 502, 503} <= operation["responses"].keys()
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    text = api.get_openapi_schema()["paths"]["/v1/completions"]["post"]
    assert {"application/json", "text/event-stream"} <= text["responses"][200]["content"].keys()
    assert {400, 401, 403, 404, 409, 429, 502, 503} <= text["responses"].keys()
    assert text["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/CompletionRequest")


# --- the official client against the live appliance ------------------------------------------


def _job_of(completion_id: str) -> Job:
    job_id = completion_id.removeprefix("chatcmpl-").removeprefix("cmpl-")
    return Job.objects.select_related("metrics", "api_token").get(pk=job_id)


def _usage_of(job: Job) -> tuple[int, int, int]:
    metrics = job.metrics
    return metrics.prompt_tokens, metrics.output_tokens, metrics.prompt_tokens + metrics.output_tokens


def _streamed_chunks(stream) -> tuple[list, list[float]]:
    """The chunks of an openai client's stream, and when each reached this process."""
    chunks, arrivals = [], []
    for chunk in stream:
        arrivals.append(time.time())
        chunks.append(chunk)
    return chunks, arrivals


def _first_token_at(job: Job) -> float:
    """When the job's first token reached its worker, as the appliance's metrics record it."""
    return job.created_at.timestamp() + job.metrics.ttft_ms / 1000


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_one_persons_prompts_are_not_found_in_the_prefix_cache_by_another(
    alice, django_user_model, live_appliance, workers, engine_host
):
    """The prefix cache is not a side channel: a person who sends another's prompt (a guess of
    a clause, a draft, a chat) finds none of it in the cache, in the metrics or in the time to
    the first token, while the owner's own second request does."""
    import uuid

    bob = django_user_model.objects.create_user(username="bob", password="another long password")
    served = engine_host.stats()["model"]
    block = engine_host.stats()["kv_block_size"]
    secret = " ".join(f"Clause {i}: the price of order {uuid.uuid4().hex} is 7,300 euros." for i in range(40))
    messages = [{"role": "user", "content": f"{secret}\nIs the price above 7,000 euros?"}]

    def cached(user) -> tuple[int, int]:
        _, raw = token_create(user=user, name="cache", scopes=["read", "write"])
        client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=120)
        completion = client.chat.completions.create(model=served, messages=messages, max_tokens=1, temperature=0)
        job = _job_of(completion.id)
        assert job.state == Job.State.SUCCEEDED, job.error
        return job.metrics.cached_prompt_tokens, job.metrics.prompt_tokens

    assert cached(alice)[0] == 0  # nobody sent this text before
    found, prompt_tokens = cached(bob)
    assert prompt_tokens > 4 * block and found == 0  # alice's prompt, in the cache, is not bob's
    found, prompt_tokens = cached(alice)
    assert found >= prompt_tokens - block  # her own, again: all of it but the last partial block


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_openai_client_against_the_live_appliance(alice, live_appliance, workers, engine_host):
    token, raw = token_create(user=alice, name="openai client", scopes=["read", "write"])
    client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=120)
    served = engine_host.stats()["model"]
    assert served in [model.id for model in client.models.list()]
    assert client.models.retrieve(served).id == served
    messages = [{"role": "user", "content": "Write one sentence about a tenancy agreement."}]

    # Not streaming: the whole answer, its usage as measured, the job it ran as.
    raw_response = client.chat.completions.with_raw_response.create(
        model=served, messages=messages, max_tokens=16, temperature=0
    )
    completion = raw_response.parse()
    job = _job_of(completion.id)
    assert raw_response.headers["X-Appliance-Job-Id"] == str(job.pk)
    assert job.state == Job.State.SUCCEEDED and job.queue == Queue.DECODE and job.api_token == token
    assert job.options["max_tokens"] == 16 and job.options["temperature"] == 0
    # Nobody was waiting: the web process ran it itself on the engine, sending no worker a message.
    assert job.dispatched_at is None and job.attempts == 1 and job.engine
    assert completion.object == "chat.completion" and completion.model == served
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.message.content == job.result_text
    assert choice.finish_reason == ("length" if job.metrics.output_tokens >= 16 else "stop")
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == _usage_of(job)
    measured = completion.model_extra["appliance"]
    assert measured["job_id"] == str(job.pk) and measured["ttft_ms"] == round(job.metrics.ttft_ms, 1)

    # Streaming: the role with the first text, then the text the job stores, the finish reason,
    # the usage.
    chunks, arrivals = _streamed_chunks(
        client.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": [{"type": "text", "text": "Name three kinds of contract."}]}],
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices[0].delta.role is None for chunk in chunks[1:] if chunk.choices)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    job = _job_of(chunks[0].id)
    # No chunk before the first token: a client's TTFT is the job's.
    assert arrivals[0] >= _first_token_at(job)
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert job.api_token == token and job.options["temperature"] == 1.0 and job.dispatched_at is None
    assert text and text == job.result_text
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == [("length" if job.metrics.output_tokens >= 24 else "stop")]
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == _usage_of(job)[:2]
    assert all(chunk.usage is None for chunk in chunks[:-1])

    # vLLM's extensions, for load tests: ignore_eos writes exactly max_tokens, and with
    # continuous_usage_stats every content chunk says how many tokens have been written so far.
    chunks, arrivals = _streamed_chunks(
        client.chat.completions.create(
            model=served,
            messages=messages,
            max_tokens=20,
            temperature=0,  # this prompt's first token is then a word
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    # The first chunk is the first token: the role with its text, counted, after it was written.
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content.strip()
    assert first.usage.completion_tokens >= 1
    assert arrivals[0] >= _first_token_at(_job_of(first.id))
    counted = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
    assert counted and counted == sorted(counted) and counted[-1] == 20
    # ... and when each token reached the worker: every token once, in order.
    times = [pair for chunk in chunks for pair in (chunk.model_extra.get("appliance") or {}).get("token_times", [])]
    assert sum(n for _, n in times) == 20 and [at for at, _ in times] == sorted(at for at, _ in times)
    job = _job_of(chunks[0].id)
    assert job.metrics.output_tokens == 20 and chunks[-1].usage.completion_tokens == 20
    assert {chunk.usage.prompt_tokens for chunk in chunks if chunk.usage} == {job.metrics.prompt_tokens}

    # Refused requests raise the client's errors with the appliance's message.
    with pytest.raises(openai.NotFoundError, match="'no-such-model'"):
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=8)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=served, messages=messages, max_tokens=8, n=2)
    assert refused.value.param == "n" and "only n=1" in refused.value.message

    # A job that fails (a prompt longer than the model's context): 502 with the reason, or an
    # error in the stream, which the client raises.
    too_long = {"model": served, "messages": [{"role": "user", "content": "lease " * 9000}], "max_tokens": 8}
    with pytest.raises(openai.InternalServerError, match="model's context") as failed:
        client.chat.completions.create(**too_long)
    assert failed.value.status_code == 502
    with pytest.raises(openai.APIError, match="model's context"):
        list(client.chat.completions.create(**too_long, stream=True))

    # A client that goes away while waiting for a whole answer cancels its job (in the middle of
    # a stream too: the next test).
    long_request = {
        "model": served,
        "messages": [{"role": "user", "content": "Write a long story about a lease."}],
        "temperature": 0,  # this prompt then runs for hundreds of tokens
    }
    before = set(Job.objects.values_list("pk", flat=True))
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=3.0).chat.completions.create(**long_request, max_tokens=1000)
    job = wait_until(lambda: Job.objects.exclude(pk__in=before).first(), timeout_s=10, message="the job")
    wait_until(lambda: Job.objects.get(pk=job.pk).state == Job.State.CANCELLED, timeout_s=30, message="the cancel")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_answer_held_to_a_json_schema_for_the_openai_client(alice, live_appliance, workers, engine_host):
    """``response_format`` as an extraction tool sends it: the engine's guided decoding lets the
    model write only JSON that matches the schema (a model this small does not write such JSON
    by itself: the same request without the format is checked to be no such answer)."""
    token, raw = token_create(user=alice, name="extraction tool", scopes=["read", "write"])
    client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=120)
    served = engine_host.stats()["model"]
    schema = {
        "type": "object",
        "properties": {
            "party": {"type": "string", "enum": ["landlord", "tenant"]},
            "notice_days": {"type": "integer", "minimum": 1, "maximum": 365},
        },
        "required": ["party", "notice_days"],
        "additionalProperties": False,
    }
    ask = {
        "model": served,
        "messages": [
            {"role": "user", "content": "The tenant may end this lease by giving 30 days' notice. Who gives notice?"}
        ],
        "max_tokens": 40,
        "temperature": 0,
    }
    held = {"type": "json_schema", "json_schema": {"name": "notice", "strict": True, "schema": schema}}

    def parsed(text: str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    def matches(value) -> bool:
        return (
            isinstance(value, dict)
            and set(value) == {"party", "notice_days"}
            and value["party"] in ("landlord", "tenant")
            and isinstance(value["notice_days"], int)
            and 1 <= value["notice_days"] <= 365
        )

    free = client.chat.completions.create(**ask).choices[0].message.content
    assert not matches(parsed(free))
    completion = client.chat.completions.create(**ask, response_format=held)
    assert completion.choices[0].finish_reason == "stop"
    answer = parsed(completion.choices[0].message.content)
    assert matches(answer), completion.choices[0].message.content
    job = _job_of(completion.id)
    assert job.options["json_schema"] == schema and job.api_token == token
    # Streamed, the chunks join into the same answer.
    chunks, _ = _streamed_chunks(client.chat.completions.create(**ask, response_format=held, stream=True))
    assert parsed("".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)) == answer
    # Any JSON object; and with an empty schema, any JSON value (free, the answer is none).
    loose = client.chat.completions.create(**{**ask, "max_tokens": 200}, response_format={"type": "json_object"})
    text = loose.choices[0].message.content
    assert text.startswith("{") and (loose.choices[0].finish_reason == "length" or isinstance(parsed(text), dict))
    assert parsed(free) is None
    anything = {"type": "json_schema", "json_schema": {"name": "any", "schema": {}}}
    value = client.chat.completions.create(**{**ask, "max_tokens": 200}, response_format=anything).choices[0]
    assert value.finish_reason == "length" or parsed(value.message.content) is not None, value.message.content
    # A completion is held the same way (the openai client's completions take it in extra_body).
    raw_prompt = ask["messages"][0]["content"] + "\nAnswer in JSON:"
    text_answer = client.completions.create(
        model=served, prompt=raw_prompt, max_tokens=40, temperature=0, extra_body={"response_format": held}
    )
    assert matches(parsed(text_answer.choices[0].text)), text_answer.choices[0].text

    # A schema the grammar compiler cannot read: 400 naming the field, no job.
    before = Job.objects.count()
    broken = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ask, response_format=broken)
    assert refused.value.param == "response_format.json_schema.schema" and "parenthesis" in refused.value.message
    assert Job.objects.count() == before
    # A keyword vLLM refuses where xgrammar would ignore it: the engine refuses the request in
    # vLLM's words, and the job fails alone (502), the engine serving on.
    ignored = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "multipleOf": 3}}}
    with pytest.raises(openai.InternalServerError, match="the engine refused this request") as failed:
        client.chat.completions.create(**ask, response_format=ignored)
    assert failed.value.status_code == 502 and "xgrammar" in failed.value.message
    # A schema xgrammar reads but cannot compile against this model's vocabulary (its compiler
    # fails on this bounded repeat): vLLM ends the request in error and lives on; the job fails
    # (before, it "succeeded" with an empty answer).
    uncompilable = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a{0,5000}$"}},
    }
    with pytest.raises(openai.InternalServerError, match="ended this request in error") as failed:
        client.chat.completions.create(**ask, response_format=uncompilable)
    assert failed.value.status_code == 502
    assert matches(parsed(client.chat.completions.create(**ask, response_format=held).choices[0].message.content))


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_raw_prompt_completion_for_the_openai_client_and_vllms_bench_client(
    alice, live_appliance, workers, engine_host, monkeypatch
):
    """``/v1/completions``, the endpoint vLLM's own ``vllm bench serve`` calls by default: the
    prompt is read as written (no chat template: its tokens are the tokenizer's own count), and
    the text comes back as the model wrote it, leading space included."""
    from django.conf import settings
    from transformers import AutoTokenizer

    token, raw = token_create(user=alice, name="completions", scopes=["read", "write"])
    client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=120)
    served = engine_host.stats()["model"]
    prompt = "The tenant shall pay the rent on the first day of"
    prompt_tokens = len(AutoTokenizer.from_pretrained(settings.APPLIANCE_MODEL).encode(prompt))

    completion = client.completions.create(model=served, prompt=prompt, max_tokens=8, temperature=0)
    job = _job_of(completion.id)
    assert completion.id == f"cmpl-{job.pk}" and completion.object == "text_completion"
    assert job.state == Job.State.SUCCEEDED and job.kind == JobKind.CHAT and job.queue == Queue.DECODE
    assert job.options["prompt"] == prompt and job.options["messages"] == [] and job.api_token == token
    text = completion.choices[0].text
    # Stored and answered as written: a continuation of a sentence starts with its space.
    assert text and text == job.result_text and text != text.strip()
    assert completion.usage.prompt_tokens == prompt_tokens == job.metrics.prompt_tokens
    assert (completion.usage.completion_tokens, completion.choices[0].finish_reason) == (
        job.metrics.output_tokens,
        "length" if job.metrics.output_tokens >= 8 else "stop",
    )

    chunks, arrivals = _streamed_chunks(
        client.completions.create(
            model=served,
            prompt=[prompt],
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    job = _job_of(chunks[0].id)
    assert arrivals[0] >= _first_token_at(job)  # the first chunk is the first token
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert streamed == job.result_text and job.metrics.output_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (prompt_tokens, 12)

    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=served, prompt=[prompt, prompt], max_tokens=8)
    assert refused.value.param == "prompt" and "one prompt a request" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=served, prompt=prompt, max_tokens=8, echo=True)
    assert refused.value.param == "echo"

    # OpenAI's presence_penalty and vLLM's sampling extensions reach the engine, as `vllm serve`
    # reads them. With a seed, sampling writes the same text each time, so a different text is
    # the option's doing: top_k 1 and min_p 1 keep only the likeliest tokens (in bfloat16 several
    # may tie, so not always the greedy text: vLLM's own), the penalties change the greedy text,
    # and min_tokens holds the end back.
    def written(**options) -> tuple[str, int]:
        body = {"model": served, "prompt": STORY, "max_tokens": 24, "temperature": 1.0, "seed": 11, **options}
        answer = client.completions.create(**body)
        return answer.choices[0].text, answer.usage.completion_tokens

    sampled, greedy = written()[0], written(temperature=0)[0]
    assert written()[0] == sampled and sampled != greedy
    assert written(extra_body={"top_k": 1})[0] != sampled and written(extra_body={"min_p": 1.0})[0] != sampled
    assert written(temperature=0, presence_penalty=2.0)[0] != greedy
    assert written(temperature=0, extra_body={"repetition_penalty": 2.0})[0] != greedy
    # logit_bias, as OpenAI defines it: a bias of 100 on one token makes greedy decoding write
    # nothing else; an id outside the vocabulary is refused by vLLM as the request enters the
    # engine, and the job fails alone with its message.
    (rent,) = AutoTokenizer.from_pretrained(settings.APPLIANCE_MODEL).encode(" rent")
    assert written(temperature=0, max_tokens=5, logit_bias={str(rent): 100})[0] == " rent" * 5
    with pytest.raises(openai.InternalServerError, match="out-of-vocab") as failed:
        written(logit_bias={"999999": 5})
    assert failed.value.status_code == 502 and "the engine refused this request" in failed.value.message
    _, short = written(prompt=SHORT_ANSWER, temperature=0, max_tokens=60)
    _, held = written(prompt=SHORT_ANSWER, temperature=0, max_tokens=60, extra_body={"min_tokens": short + 10})
    assert short < 50 and held >= short + 10
    job = Job.objects.filter(api_token=token).latest("created_at")
    assert job.options["min_tokens"] == short + 10

    # vLLM's own bench client, as `vllm bench serve` runs it with its default backend.
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    monkeypatch.setenv("OPENAI_API_KEY", raw)

    async def bench_request():
        async with aiohttp.ClientSession() as session:
            request = RequestFuncInput(
                prompt=prompt,
                api_url=f"{live_appliance}/v1/completions",
                prompt_len=prompt_tokens,
                output_len=10,
                model=served,
                ignore_eos=True,
            )
            return await async_request_openai_completions(request, session)

    output = asyncio.run(bench_request())
    assert output.success, output.error
    job = Job.objects.select_related("metrics").filter(api_token=token).latest("created_at")
    assert output.generated_text == job.result_text and output.output_tokens == 10 == job.metrics.output_tokens
    assert output.prompt_len == prompt_tokens and output.ttft > 0


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_client_that_hangs_up_in_the_middle_of_a_stream_cancels_its_job(alice, live_appliance, workers, engine_host):
    """A chat client's Stop button closes the stream: the engine must stop writing for nobody,
    or every abandoned answer keeps a decode slot busy to its last token."""
    _, raw = token_create(user=alice, name="hang-up", scopes=["read", "write"])
    client = openai.OpenAI(base_url=f"{live_appliance}/v1", api_key=raw, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=engine_host.stats()["model"],
        messages=[{"role": "user", "content": "Write a long story about a lease."}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},  # it would run for all 2000 tokens
    )
    read = []
    for chunk in stream:
        read.append(chunk)
        if len(read) == 3:
            break
    stream.close()  # the connection, not only the iterator
    job = _job_of(read[0].id)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == Job.State.CANCELLED,
        timeout_s=30,
        message="the hung-up stream's job cancelled",
    )
    # Stopped in the engine, not merely marked: nothing runs there any more, long before its 2000
    # tokens could have been written.
    wait_until(
        lambda: engine_host.stats()["running"] == 0 and engine_host.stats()["requests_in_host"] == 0,
        timeout_s=30,
        message="the engine request aborted",
    )
    assert not Job.objects.get(pk=job.pk).result_text


def test_the_v1_operation_ids_stay_what_generated_clients_call():
    schema = api.get_openapi_schema()
    ids = {
        (path, method): operation["operationId"]
        for path, operations in schema["paths"].items()
        if path.startswith("/v1/")
        for method, operation in operations.items()
    }
    assert ids == {
        ("/v1/models", "get"): "inference_openai_api_models_list",
        ("/v1/models/{model}", "get"): "inference_openai_api_models_get",
        ("/v1/chat/completions", "post"): "inference_openai_api_chat_completions",
        ("/v1/completions", "post"): "inference_openai_api_completions",
    }
