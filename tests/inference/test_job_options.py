"""The options of each job kind (``inference/job_options.py``): what a row holds, read back alike."""

from __future__ import annotations

import pytest

from inference.job_options import ChatOptions, ClauseOptions, DraftOptions, Sampling, SummaryOptions, storable
from inference.sampling import SamplingExtras

EXAMPLES = [
    SummaryOptions(length="brief", focus="payment terms", max_tokens=64, ignore_eos=True),
    SummaryOptions(),
    ClauseOptions(taxonomy="cuad", categories=("Governing Law", "Cap On Liability")),
    ChatOptions(
        messages=({"role": "user", "content": "Hello"},),
        max_tokens=16,
        temperature=0.7,
        top_p=0.9,
        seed=7,
        stop=("\n\n",),
        frequency_penalty=0.5,
        ignore_eos=True,
    ),  # fmt: skip
    ChatOptions(messages=({"role": "user", "content": "Hello"},), max_tokens=16),
    ChatOptions(messages=(), max_tokens=16, prompt="Once upon a time", temperature=1.0),
    ChatOptions(
        messages=({"role": "user", "content": "Hello"},),
        max_tokens=16,
        extras=SamplingExtras(
            presence_penalty=0.3, repetition_penalty=1.1, top_k=5, min_p=0.1, min_tokens=2, logit_bias=((9, -1.0),)
        ),
        json_schema={"type": "object", "properties": {"days": {"type": "integer"}}},
    ),
    DraftOptions(
        message="Dear Sir", document_ids=(3, 5), tone="formal", length="short", temperature=0.7, regenerated_from="41"
    ),  # fmt: skip
    DraftOptions(message="Dear Sir", group_id=2),
]


@pytest.mark.parametrize("options", EXAMPLES, ids=lambda o: type(o).__name__)
def test_what_is_written_reads_back_the_same(options):
    assert type(options).from_json(options.to_json()) == options


def test_rows_keep_the_shape_they_always_had():
    assert SummaryOptions(length="standard").to_json() == {"length": "standard", "focus": ""}
    assert ClauseOptions(taxonomy="office", categories=("Term",)).to_json() == {
        "taxonomy": "office",
        "categories": ["Term"],
    }
    # A chat row holds only the sampling options that differ from the engine's defaults.
    assert ChatOptions(messages=({"role": "user", "content": "Hi"},), max_tokens=8).to_json() == {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "temperature": 0.0,
        "ignore_eos": False,
    }
    assert "regenerated_from" not in DraftOptions(message="m").to_json()
    # A raw completion's row holds its prompt, and no messages.
    raw = ChatOptions(messages=(), max_tokens=8, prompt=" Dear").to_json()
    assert raw["prompt"] == " Dear" and raw["messages"] == []


def test_an_older_row_without_optional_keys_reads_with_the_defaults():
    assert SummaryOptions.from_json({}) == SummaryOptions()
    draft = DraftOptions.from_json({"message": "m", "tone": "warm", "length": "short"})
    assert (draft.document_ids, draft.group_id, draft.temperature) == ((), None, 0.0)
    sampling = Sampling.from_json({"temperature": 0.2})
    assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.stop) == (0.2, 1.0, None, ())
    assert sampling.frequency_penalty is None  # not chosen: the runner's default for the kind applies


def test_every_kind_s_sampling_is_read_from_its_row():
    chat = ChatOptions(messages=({"role": "user", "content": "Hi"},), max_tokens=8, top_p=0.5, seed=3,
                       stop=("x",), frequency_penalty=1.0, ignore_eos=True)  # fmt: skip
    assert Sampling.from_json(chat.to_json()) == Sampling(
        temperature=0.0, top_p=0.5, seed=3, stop=("x",), frequency_penalty=1.0, ignore_eos=True
    )
    assert Sampling.from_json(DraftOptions(message="m", temperature=0.7).to_json()).temperature == 0.7
    assert Sampling.from_json(SummaryOptions(ignore_eos=True).to_json()).ignore_eos is True
    extras = SamplingExtras(top_k=3, min_tokens=1)
    chosen = ChatOptions(messages=({"role": "user", "content": "Hi"},), max_tokens=8, extras=extras).to_json()
    assert Sampling.from_json(chosen).extras == extras and Sampling.from_json({}).extras == SamplingExtras()


def test_what_postgres_cannot_store_becomes_the_replacement_character_and_nothing_else_changes():
    options = {"messages": [{"role": "user", "content": "a\x00b\udc80c"}], "stop": ("\x00",), "max_tokens": 8,
               "prompt": "Café \t\n€ 5"}  # fmt: skip
    assert storable(options) == {
        "messages": [{"role": "user", "content": "a\ufffdb\ufffdc"}],
        "stop": ["\ufffd"],
        "max_tokens": 8,
        "prompt": "Café \t\n€ 5",
    }
