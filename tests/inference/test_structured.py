"""A chat answer held to a JSON schema (``inference/structured.py``): which ``response_format``
asks for which schema, and which schemas are refused before a job is written, in words a person
understands. xgrammar, the engine's own grammar compiler, is real here; the live test with the
engine is in ``test_openai_api.py``."""

from __future__ import annotations

import pytest

from inference.structured import SCHEMA_MAX_BYTES, SCHEMA_MAX_NESTING, SchemaRefused, response_schema, schema_problem

NOTICE = {
    "type": "object",
    "properties": {
        "party": {"type": "string", "enum": ["landlord", "tenant"]},
        "notice_days": {"type": "integer", "minimum": 1},
        "clauses": {"type": "array", "items": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)*$"}},
    },
    "required": ["party", "notice_days"],
    "additionalProperties": False,
}


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def test_each_response_format_asks_for_its_schema():
    assert response_schema(None) is None
    assert response_schema({"type": "text"}) is None and response_schema({}) is None
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    assert response_schema({"type": "json_schema", "json_schema": {"name": "notice", "schema": NOTICE}}) == NOTICE
    # An empty schema is a schema (any JSON value), not "no schema".
    assert response_schema({"type": "json_schema", "json_schema": {"schema": {}}}) == {}


@pytest.mark.parametrize(
    ("response_format", "field", "words"),
    [
        ({"type": "grammar"}, "response_format.type", "'grammar' is not supported"),
        ({"type": "json_schema"}, "response_format.json_schema", '{"name": ..., "schema": {...}}'),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema", "an object"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}}, "response_format.json_schema.schema", "an object"),
        (
            {"type": "json_schema", "json_schema": {"schema": {"enum": ["x" * SCHEMA_MAX_BYTES]}}},
            "response_format.json_schema.schema",
            f"at most {SCHEMA_MAX_BYTES} are accepted",
        ),
    ],
)
def test_a_format_the_engine_cannot_follow_is_refused_naming_where(response_format, field, words):
    with pytest.raises(SchemaRefused) as refused:
        response_schema(response_format)
    assert refused.value.field == field and words in str(refused.value)


def test_a_schema_is_checked_by_the_engines_grammar_compiler_and_its_message_is_kept_readable():
    assert schema_problem(NOTICE) is None
    # Read as the request arrives (on the web server's loop): its shape and bounds only.
    unknown_type = {"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}
    assert response_schema(unknown_type) == {"type": "objectx"}
    # Compiled when the job is created.
    assert schema_problem({"type": "objectx"}) == 'the engine cannot follow this schema: Unsupported type "objectx"'

    broken = schema_problem({"type": "string", "pattern": "(unclosed"})
    # xgrammar's own words, without the time and the C++ source line it puts before them.
    assert broken == (
        "the engine cannot follow this schema: Regex parsing error at position 10: The parenthesis is not closed."
    )
    assert schema_problem({"type": "object", "required": 5}) is not None
    assert schema_problem("{}") == "a JSON schema must be an object."


def test_a_schema_is_bounded_in_size_and_depth_before_it_is_compiled():
    assert schema_problem(_nested(SCHEMA_MAX_NESTING // 2)) is None
    assert "more than 64 levels deep" in schema_problem(_nested(SCHEMA_MAX_NESTING + 1))
    # Deeper than Python's own recursion limit: refused, not a crash.
    assert "levels deep" in schema_problem(_nested(5000))
    big = {"type": "string", "enum": ["x" * 1000 for _ in range(40)]}
    assert f"at most {SCHEMA_MAX_BYTES} are accepted" in schema_problem(big)
    assert schema_problem({"type": "number", "maximum": float("nan")}) == "the schema is not plain JSON."
    # Stored, these would become U+FFFD: the answer would be held to another schema than was asked.
    for unstorable in ("\x00", "\ud800"):
        assert "NUL character or a lone surrogate" in schema_problem({"enum": [f"a{unstorable}b"]})
