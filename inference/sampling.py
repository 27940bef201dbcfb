"""The sampling options a chat job may carry beyond those every job kind has (temperature, top_p,
seed, stop, frequency_penalty): OpenAI's ``presence_penalty`` and ``logit_bias`` and vLLM's own
extensions, as an OpenAI-compatible client (Open WebUI, LibreChat, a script) or ``vllm bench
serve`` sends them. Pure: no ORM, no vLLM.

One type from the request to the engine: ``openai_api.translation`` reads it from the request,
``services.job_create_chat`` checks it and keeps it in the job's options (``job_options``), the
engine request carries it (``engine.protocol``), and the engine host hands it to vLLM's
``SamplingParams``. Each layer writes only what differs from vLLM's defaults, so that a row or a
request without them reads as it always did (a summary's kept sections are found by the request's
fingerprint, ``running.request_fingerprint``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingExtras:
    presence_penalty: float = 0.0  # OpenAI's: > 0 discourages any token the output already has
    repetition_penalty: float = 1.0  # vLLM's: > 1 discourages the prompt's and the output's tokens
    top_k: int = 0  # vLLM's: sample among the k likeliest tokens (0, or -1 as vLLM also reads it: all)
    min_p: float = 0.0  # vLLM's: only tokens at least this share of the likeliest one's probability
    min_tokens: int = 0  # vLLM's: no end of the answer (the model's or a stop sequence) before this many
    # OpenAI's: (token id, bias) pairs, by id; the bias (-100 to 100) is added to the token's logit.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def problem(self, max_tokens: int) -> tuple[str, str] | None:
        """The first option the engine would refuse, as (field, message a person understands);
        None when every one holds. The types are the schema's and ``from_json``'s to hold."""
        if not -2.0 <= self.presence_penalty <= 2.0:
            return "presence_penalty", "presence_penalty must be between -2 and 2."
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0):
            return "repetition_penalty", "repetition_penalty must be a number greater than 0 (1: none)."
        if self.top_k < -1:
            return "top_k", "top_k must be 0 or -1 for every token, or at least 1."
        if not 0.0 <= self.min_p <= 1.0:
            return "min_p", "min_p must be between 0 and 1."
        if self.min_tokens < 0:
            return "min_tokens", "min_tokens must be 0 or more."
        if self.min_tokens > max_tokens:
            return "min_tokens", f"min_tokens ({self.min_tokens}) must not be more than max_tokens ({max_tokens})."
        if len(self.logit_bias) > LOGIT_BIAS_MAX_TOKENS:
            return "logit_bias", f"logit_bias may hold at most {LOGIT_BIAS_MAX_TOKENS} tokens."
        if any(token < 0 for token, _ in self.logit_bias):
            return "logit_bias", LOGIT_BIAS_KEYS
        if not all(math.isfinite(bias) and -100.0 <= bias <= 100.0 for _, bias in self.logit_bias):
            return "logit_bias", "logit_bias's values must be between -100 and 100."
        return None

    def to_json(self) -> dict[str, Any]:
        """The options that differ from vLLM's defaults, flat (``logit_bias`` as OpenAI sends it:
        token ids as the keys of an object)."""
        data = {name: value for name, value in asdict(self).items() if value != getattr(NO_EXTRAS, name)}
        if self.logit_bias:
            data["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SamplingExtras:
        """Read from a job's options or an engine request (other keys ignored; missing ones are
        the defaults)."""
        top_k = int(data.get("top_k", 0))
        bias = data.get("logit_bias") or {}
        if not isinstance(bias, Mapping):
            raise TypeError("logit_bias must be an object of token ids to biases")
        return cls(
            presence_penalty=float(data.get("presence_penalty", 0.0)),
            repetition_penalty=float(data.get("repetition_penalty", 1.0)),
            top_k=0 if top_k == -1 else top_k,  # -1: vLLM's other way of saying "every token"
            min_p=float(data.get("min_p", 0.0)),
            min_tokens=int(data.get("min_tokens", 0)),
            # Raises ValueError for a key that is not a whole number: the caller's to refuse.
            logit_bias=tuple(sorted((int(token), float(value)) for token, value in bias.items())),
        )

    def sampling_params(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's ``SamplingParams`` (which checks the token ids against
        the model's vocabulary)."""
        return {**asdict(self), "logit_bias": dict(self.logit_bias) or None}


LOGIT_BIAS_MAX_TOKENS = 300  # as OpenAI's API
LOGIT_BIAS_KEYS = "logit_bias's keys must be token ids (whole numbers from 0)."
NO_EXTRAS = SamplingExtras()  # vLLM's defaults: the sampling every other job has
