"""inference/engine/protocol.py: one JSON object per line between the engine host and clients."""

from __future__ import annotations

import json

import pytest

from inference.engine.protocol import EngineState, EngineStats, GenerateRequest, Priority, ProtocolError, decode, encode
from inference.sampling import SamplingExtras


def _request(**overrides) -> GenerateRequest:
    fields = {
        "request_id": "req-1",
        "messages": [
            {"role": "system", "content": "You are careful."},
            {"role": "user", "content": "Résumé of «the» contract, 4,800 £ — page 2\nsecond line"},
        ],
        "max_tokens": 256,
        "priority": Priority.DECODE,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 1234,
        "queue": "decode",
        "stop": ["</answer>", "\n\n"],
    }
    fields.update(overrides)
    return GenerateRequest(**fields)


def test_encode_is_one_line_of_json():
    line = encode({"op": "stats", "text": "a\nb"})
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1  # a newline inside a string is escaped
    assert json.loads(line) == {"op": "stats", "text": "a\nb"}


def test_encode_keeps_unicode_as_utf8():
    line = encode({"text": "£ é"})
    assert "£ é".encode() in line


def test_round_trip_of_a_generate_request():
    request = _request()
    line = encode(request.to_message())
    message = decode(line)
    assert message["op"] == "generate"
    assert GenerateRequest.from_message(message) == request


def test_round_trip_with_defaults():
    request = GenerateRequest(request_id="r", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    back = GenerateRequest.from_message(decode(encode(request.to_message())))
    assert back == request
    assert back.priority == Priority.PREFILL
    assert back.seed is None
    assert back.stop == []
    assert back.queue == "prefill"


def test_from_message_applies_defaults_for_optional_fields():
    request = GenerateRequest.from_message(
        {"request_id": "r", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    )
    assert request.priority == Priority.PREFILL
    assert request.temperature == 0.0
    assert request.top_p == 1.0
    assert request.seed is None
    assert request.stop == []


def test_from_message_coerces_types():
    request = GenerateRequest.from_message(
        {"request_id": 42, "messages": [{"role": "user", "content": 7}], "max_tokens": "3", "seed": "9"}
    )
    assert request.request_id == "42"
    assert request.messages == [{"role": "user", "content": "7"}]
    assert request.max_tokens == 3
    assert request.seed == 9


def test_from_message_drops_extra_message_keys():
    request = GenerateRequest.from_message(
        {"request_id": "r", "messages": [{"role": "user", "content": "hi", "name": "x"}], "max_tokens": 5}
    )
    assert request.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("line", [b"not json\n", b'{"op": \n', b"\xff\xfe\n", b""])
def test_decode_rejects_non_json(line):
    with pytest.raises(ProtocolError, match="not a JSON line"):
        decode(line)


@pytest.mark.parametrize("line", [b"[1, 2]\n", b'"text"\n', b"42\n", b"null\n"])
def test_decode_rejects_non_objects(line):
    with pytest.raises(ProtocolError, match="JSON object"):
        decode(line)


def test_protocol_error_is_a_value_error():
    assert issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize("missing", ["request_id", "messages", "max_tokens"])
def test_from_message_rejects_missing_fields(missing):
    message = _request().to_message()
    del message[missing]
    with pytest.raises(ProtocolError, match="bad generate request"):
        GenerateRequest.from_message(message)


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_from_message_rejects_max_tokens_below_one(max_tokens):
    message = _request(max_tokens=max_tokens).to_message()
    with pytest.raises(ProtocolError, match="max_tokens"):
        GenerateRequest.from_message(message)


@pytest.mark.parametrize("penalty", [2.5, -3.0, "much"])
def test_from_message_rejects_a_frequency_penalty_out_of_range(penalty):
    message = _request().to_message()
    message["frequency_penalty"] = penalty
    with pytest.raises(ProtocolError, match="frequency_penalty|bad generate request"):
        GenerateRequest.from_message(message)
    message["frequency_penalty"] = 0.3
    assert GenerateRequest.from_message(message).frequency_penalty == 0.3


def test_from_message_rejects_empty_messages():
    message = _request().to_message()
    message["messages"] = []
    with pytest.raises(ProtocolError, match="no messages"):
        GenerateRequest.from_message(message)


def test_a_raw_prompt_goes_instead_of_messages_and_is_left_out_when_unused():
    raw = GenerateRequest(request_id="9-1-chat", messages=[], max_tokens=8, prompt="Once upon a time")
    assert GenerateRequest.from_message(raw.to_message()) == raw
    # A request of messages reads as it always did: a summary's finished sections are kept under
    # the fingerprint of this message, which must not change with the new field.
    assert "prompt" not in _request().to_message()
    both = {**_request().to_message(), "prompt": "Once upon a time"}
    with pytest.raises(ProtocolError, match="both messages and a raw prompt"):
        GenerateRequest.from_message(both)
    with pytest.raises(ProtocolError, match="no messages and no prompt"):
        GenerateRequest.from_message({**raw.to_message(), "prompt": ""})


def test_sampling_extras_cross_flat_and_only_when_they_change_something():
    extras = SamplingExtras(
        presence_penalty=0.4,
        repetition_penalty=1.1,
        top_k=30,
        min_p=0.05,
        min_tokens=8,
        logit_bias=((7, -2.5), (42, 5.0)),
    )
    request = _request(extras=extras)
    message = decode(encode(request.to_message()))
    names = ("presence_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens", "logit_bias")
    assert {k: message[k] for k in names} == {
        "presence_penalty": 0.4,
        "repetition_penalty": 1.1,
        "top_k": 30,
        "min_p": 0.05,
        "min_tokens": 8,
        "logit_bias": {"7": -2.5, "42": 5.0},  # as OpenAI sends it
    }
    # vLLM's SamplingParams takes the bias by token id, and no bias as None.
    assert extras.sampling_params()["logit_bias"] == {7: -2.5, 42: 5.0}
    assert SamplingExtras().sampling_params()["logit_bias"] is None
    assert GenerateRequest.from_message(message) == request
    assert GenerateRequest.from_message({**message, "top_k": -1}).extras.top_k == 0  # vLLM's other "all"
    # A request without them is the message it always was (a summary's kept sections are found
    # by its fingerprint).
    assert "extras" not in _request().to_message()
    assert (
        not {"presence_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens"} & _request().to_message().keys()
    )
    assert _request(extras=SamplingExtras(top_k=2)).to_message().keys() - _request().to_message().keys() == {"top_k"}


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("presence_penalty", 2.5, "presence_penalty"),
        ("repetition_penalty", 0, "repetition_penalty"),
        ("top_k", -3, "top_k"),
        ("min_p", 1.2, "min_p"),
        ("min_tokens", 257, "min_tokens"),  # more than the request's max_tokens
        ("top_k", "many", "bad generate request"),
        ("logit_bias", {"-1": 5}, "token ids"),
        ("logit_bias", {"5": 101}, "between -100 and 100"),
        ("logit_bias", {"5": float("nan")}, "between -100 and 100"),
        ("logit_bias", {str(i): 1 for i in range(301)}, "at most 300 tokens"),
        ("logit_bias", {"five": 1}, "bad generate request"),
        ("logit_bias", [5, 1], "bad generate request"),
    ],
)
def test_from_message_refuses_sampling_extras_vllm_would(field, value, says):
    with pytest.raises(ProtocolError, match=says):
        GenerateRequest.from_message({**_request().to_message(), field: value})


def test_from_message_rejects_empty_request_id():
    message = _request().to_message()
    message["request_id"] = ""
    with pytest.raises(ProtocolError, match="request_id"):
        GenerateRequest.from_message(message)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user"}],  # no content
        [{"content": "hi"}],  # no role
        ["just a string"],
        None,
        42,
    ],
)
def test_from_message_rejects_malformed_messages(messages):
    message = _request().to_message()
    message["messages"] = messages
    with pytest.raises(ProtocolError, match="bad generate request"):
        GenerateRequest.from_message(message)


@pytest.mark.parametrize(
    "field,value", [("max_tokens", "many"), ("priority", "high"), ("temperature", "hot"), ("seed", "x")]
)
def test_from_message_rejects_non_numeric_numbers(field, value):
    message = _request().to_message()
    message[field] = value
    with pytest.raises(ProtocolError, match="bad generate request"):
        GenerateRequest.from_message(message)


def test_priorities_order_decode_before_prefill():
    assert Priority.DECODE < Priority.PREFILL


def test_engine_stats_read_what_a_host_sends_and_leave_what_they_do_not_know():
    engine = EngineStats.from_message({"type": "stats", "model": "m", "running": 2, "kv_usage": 0.5, "new_field": 1})
    assert (engine.model, engine.running, engine.kv_usage, engine.state) == ("m", 2, 0.5, EngineState.READY)
    assert engine.waiting is None and engine.target_step_ms is None  # not sent: not known
    assert EngineStats.from_message({"state": "restarting"}).state == EngineState.RESTARTING
    round_trip = EngineStats.from_message(json.loads(encode(engine.to_message())))
    assert round_trip == engine


def test_the_api_shows_declared_fields_and_software_versions_and_core_layout_to_staff_only():
    public, staff = EngineStats.api_fields(staff=False), EngineStats.api_fields(staff=True)
    assert {"model", "licence", "dtype", "kv_cache_dtype", "max_model_len", "kv_capacity_tokens", "kv_usage"} <= set(
        public
    )
    assert set(staff) - set(public) == {"vllm_version", "torch_version", "model_cpus", "service_cpus"}
    assert not {"vllm_version", "torch_version", "pid", "model_path", "driver", "model_cpus"} & set(public)
