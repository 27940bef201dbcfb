"""The options of each kind of job, as one type used where a job is made (``services``) and where
it runs or is tried again (``running``, ``services.retry``). Pure: no ORM.

``Job.options`` holds ``to_json()`` of one of these; ``from_json`` reads it back, giving the
default for a key an older row does not have. ``to_json`` writes the keys the rows have always
had (optional ones only when they differ from their default), so that rows written before these
types and rows written after read alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference.clauses import DEFAULT_TAXONOMY
from inference.prompts import DEFAULT_DRAFT_LENGTH, DEFAULT_DRAFT_TONE, DEFAULT_SUMMARY_LENGTH
from inference.sampling import NO_EXTRAS, SamplingExtras

# What Postgres cannot store in text or jsonb (NUL), and what is not text at all (a lone UTF-16
# surrogate, which JSON's "\ud800" can still make): each becomes U+FFFD, the replacement
# character, as a decoder marks what it could not read. A random benchmark prompt, a pasted
# binary fragment or a model's byte token then costs one character, not the request.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def storable(value: Any) -> Any:
    """``value`` (a job's options: dicts, lists and scalars) with every string ``storable_text``."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


@dataclass(frozen=True)
class Sampling:
    """What a job of any kind may ask of the engine's sampling (``running.engine_request``)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float | None = None  # None: the runner's default for the kind
    ignore_eos: bool = False  # benchmarks: always write max_tokens
    extras: SamplingExtras = NO_EXTRAS  # a chat job's: what an OpenAI client may also set

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sampling:
        penalty = data.get("frequency_penalty")
        return cls(
            temperature=float(data.get("temperature", 0.0)),
            top_p=float(data.get("top_p", 1.0)),
            seed=None if data.get("seed") is None else int(data["seed"]),
            stop=tuple(str(s) for s in data.get("stop", ())),
            frequency_penalty=None if penalty is None else float(penalty),
            ignore_eos=bool(data.get("ignore_eos", False)),
            extras=SamplingExtras.from_json(data),
        )


@dataclass(frozen=True)
class SummaryOptions:
    length: str = DEFAULT_SUMMARY_LENGTH
    focus: str = ""
    max_tokens: int | None = None  # None: APPLIANCE_SUMMARY_MAX_TOKENS
    ignore_eos: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"length": self.length, "focus": self.focus}
        if self.max_tokens is not None:
            data["max_tokens"] = self.max_tokens
        if self.ignore_eos:
            data["ignore_eos"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryOptions:
        return cls(
            length=str(data.get("length", DEFAULT_SUMMARY_LENGTH)),
            focus=str(data.get("focus", "")),
            max_tokens=int(data["max_tokens"]) if data.get("max_tokens") else None,
            ignore_eos=bool(data.get("ignore_eos", False)),
        )


@dataclass(frozen=True)
class ClauseOptions:
    taxonomy: str = DEFAULT_TAXONOMY
    categories: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"taxonomy": self.taxonomy, "categories": list(self.categories)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClauseOptions:
        return cls(
            taxonomy=str(data.get("taxonomy", DEFAULT_TAXONOMY)),
            categories=tuple(str(c) for c in data.get("categories") or ()),
        )


@dataclass(frozen=True)
class ChatOptions:
    """A chat job's request: ``messages`` in the model's chat template, or (``/v1/completions``)
    a raw ``prompt`` continued as written, whose answer is kept verbatim."""

    messages: tuple[dict[str, str], ...]
    max_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    prompt: str = ""
    extras: SamplingExtras = NO_EXTRAS
    json_schema: dict[str, Any] | None = None  # the answer must match it (``structured``)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "messages": [{"role": m["role"], "content": m["content"]} for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
        }
        if self.prompt:
            data["prompt"] = self.prompt
        # Only what differs from the engine's defaults, so that the jobs of the browser and the
        # benchmarks keep the options they always had.
        if self.top_p != 1.0:
            data["top_p"] = self.top_p
        if self.seed is not None:
            data["seed"] = self.seed
        if self.stop:
            data["stop"] = list(self.stop)
        if self.frequency_penalty:
            data["frequency_penalty"] = self.frequency_penalty
        data.update(self.extras.to_json())
        if self.json_schema is not None:
            data["json_schema"] = self.json_schema
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatOptions:
        sampling = Sampling.from_json(data)
        return cls(
            messages=tuple({"role": str(m["role"]), "content": str(m["content"])} for m in data.get("messages") or ()),
            max_tokens=int(data["max_tokens"]),
            temperature=sampling.temperature,
            ignore_eos=sampling.ignore_eos,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop=sampling.stop,
            frequency_penalty=sampling.frequency_penalty or 0.0,
            prompt=str(data.get("prompt") or ""),
            extras=sampling.extras,
            json_schema=data.get("json_schema"),
        )


@dataclass(frozen=True)
class DraftOptions:
    message: str
    document_ids: tuple[int, ...] = ()
    group_id: int | None = None
    tone: str = DEFAULT_DRAFT_TONE
    length: str = DEFAULT_DRAFT_LENGTH
    temperature: float = 0.0
    regenerated_from: str | None = None  # the job id of the draft this one was made again from

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "message": self.message,
            "document_ids": list(self.document_ids),
            "group_id": self.group_id,
            "tone": self.tone,
            "length": self.length,
            "temperature": self.temperature,
        }
        if self.regenerated_from is not None:
            data["regenerated_from"] = self.regenerated_from
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DraftOptions:
        regenerated = data.get("regenerated_from")
        return cls(
            message=str(data["message"]),
            document_ids=tuple(int(i) for i in _sequence(data.get("document_ids"))),
            group_id=None if data.get("group_id") is None else int(data["group_id"]),
            tone=str(data.get("tone", DEFAULT_DRAFT_TONE)),
            length=str(data.get("length", DEFAULT_DRAFT_LENGTH)),
            temperature=float(data.get("temperature", 0.0)),
            regenerated_from=None if regenerated is None else str(regenerated),
        )


def _sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()
