"""Which event ids a job's stream resumes after (``inference.events.valid_event_id``, pure): only
ids Redis reads. Others are a 400 on the API and a stream from the start in the browser; let
through, Redis refused them after the stream's first bytes, and the client reconnected with
the same id every 2 s."""

from __future__ import annotations

import pytest

from inference.events import valid_event_id


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (None, True),  # no Last-Event-ID: from the start
        ("0", True),
        ("1765065600000-0", True),
        ("18446744073709551615-18446744073709551615", True),  # the largest Redis reads
        ("18446744073709551616-0", False),  # one past 64 bits
        ("99999999999999999999-0", False),
        ("1-1\n", False),  # "$" matched before a final newline
        ("\u0661-\u0661", False),  # Arabic-Indic digits, which "\d" matched
        ("1; DROP", False),
        ("", False),
        ("-1-0", False),
    ],
)
def test_only_event_ids_redis_reads_are_valid(value, valid):
    assert valid_event_id(value) is valid
