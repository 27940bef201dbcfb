"""Answers held to a JSON schema: OpenAI's ``response_format`` on ``/v1/chat/completions``, as
``vllm serve`` reads it.

A tool that extracts fields from a document asks for ``{"type": "json_schema", "json_schema":
{"name": ..., "schema": {...}}}`` (or ``{"type": "json_object"}``: any JSON object) and parses
the answer. The engine's guided decoding (xgrammar, the backend the engine host configures)
then lets the model write only text that matches the schema, as the clause job's answers do.

The schema is checked before a job is written, so that a schema the engine cannot read is a 400
naming the field, not a failed job: bounded in size and nesting (vLLM's own nesting limit) as
the request is read (``response_schema``, cheap, on the web server's event loop), then converted
to a grammar by xgrammar itself when the job is created (``schema_problem``, in
``services.job_create_chat``, off the loop: xgrammar's first import takes seconds; the engine
compiles that grammar against the model's vocabulary later, as vLLM does). vLLM refuses a few
keywords xgrammar would convert but ignore (``multipleOf``, ``uniqueItems``, a string ``format``
it does not know, ...); those are refused by the engine host with vLLM's message, and the job
fails with it (``vllm serve`` with its default ``auto`` backend would hand such a schema to
another grammar library instead; the appliance's engine uses xgrammar alone).

vLLM's own ``structured_outputs`` field is refused (400), not ignored: JSON is asked for with
``response_format``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from inference.job_options import storable

SCHEMA_MAX_BYTES = 32 * 1024  # serialised; a schema is a few hundred bytes to a few KiB
SCHEMA_MAX_NESTING = 64  # objects and arrays inside each other: vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # "json_object": what vLLM compiles for it


class SchemaRefused(ValueError):
    """The request's ``response_format`` or schema cannot be honoured; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def response_schema(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The schema the answer must match, from OpenAI's ``response_format`` (None: free text).
    Raises ``SchemaRefused`` naming the field."""
    if response_format is None:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(ANY_OBJECT)
    if kind != "json_schema":
        raise SchemaRefused(
            "response_format.type", f'{kind!r} is not supported; use "text", "json_object" or "json_schema".'
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise SchemaRefused(
            "response_format.json_schema",
            'a "json_schema" response format needs {"name": ..., "schema": {...}} here.',
        )
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise SchemaRefused("response_format.json_schema.schema", "must be a JSON schema (an object).")
    schema = dict(schema)
    problem = _bounds_problem(schema)
    if problem:
        raise SchemaRefused("response_format.json_schema.schema", problem)
    return schema


def schema_problem(schema: Any) -> str | None:
    """Why the engine could not hold an answer to ``schema``, in words a person understands;
    None when it can. Converts it to a grammar: not on an event loop."""
    problem = _bounds_problem(schema)
    if problem:
        return problem
    import xgrammar  # noqa: PLC0415 - heavy (it loads torch): only when a schema is asked for

    try:
        xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except Exception as exc:  # xgrammar raises RuntimeError with its converter's message
        return f"the engine cannot follow this schema: {_converter_message(exc)}"
    return None


# xgrammar's messages start with the time and its source line: "[13:20:28]
# /project/cpp/json_schema_converter.cc:4944: Unsupported type "objectx"".
_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def _converter_message(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return _SOURCE_PREFIX.sub("", lines[0]) if lines else type(exc).__name__


def _bounds_problem(schema: Any) -> str | None:
    """What is wrong with ``schema`` before it is converted: not an object, too deep, not JSON,
    not storable, too large."""
    if not isinstance(schema, dict):
        return "a JSON schema must be an object."
    if _nesting(schema) > SCHEMA_MAX_NESTING:
        return f"the schema nests objects and arrays more than {SCHEMA_MAX_NESTING} levels deep."
    try:
        size = len(json.dumps(schema, allow_nan=False).encode())
    except (TypeError, ValueError):
        return "the schema is not plain JSON."
    if storable(schema) != schema:
        # Stored, it would become U+FFFD and the answer be held to another schema than was asked.
        return "a schema may not hold a NUL character or a lone surrogate."
    if size > SCHEMA_MAX_BYTES:
        return f"the schema is {size} bytes; at most {SCHEMA_MAX_BYTES} are accepted."
    return None


def _nesting(value: Any) -> int:
    """How deep objects and arrays go inside ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
