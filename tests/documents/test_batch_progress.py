"""Pages per second and the ETA of a batch, from what was measured (``documents.batch_progress``)."""

from __future__ import annotations

import pytest

from documents.batch_progress import BatchRate, batch_rate, format_duration


def test_rate_is_pages_read_over_time_and_eta_counts_unopened_files_at_the_mean():
    # 40 pages read in 20 s: 2 pages/s. Left: 10 pages of a file being read, and 3 files not
    # opened yet, at the mean of the 4 opened (80 pages / 4 = 20 each): 70 pages, 35 s.
    rate = batch_rate(
        elapsed_s=20, pages_done=40, pages_left_known=10, files_opened=4, pages_opened=80, files_unopened=3
    )
    assert rate == BatchRate(pages_per_s=2.0, eta_s=35.0)


def test_no_rate_before_a_page_is_read_and_no_eta_before_a_file_is_opened():
    assert batch_rate(
        elapsed_s=30, pages_done=0, pages_left_known=12, files_opened=1, pages_opened=12, files_unopened=0
    ) == BatchRate(None, None)
    assert batch_rate(
        elapsed_s=0.2, pages_done=5, pages_left_known=5, files_opened=1, pages_opened=10, files_unopened=0
    ) == BatchRate(None, None)  # too short to measure
    only_unopened = batch_rate(
        elapsed_s=30, pages_done=10, pages_left_known=0, files_opened=0, pages_opened=0, files_unopened=5
    )
    assert only_unopened.pages_per_s == pytest.approx(10 / 30) and only_unopened.eta_s is None


def test_nothing_left_is_an_eta_of_zero():
    assert batch_rate(
        elapsed_s=50, pages_done=100, pages_left_known=0, files_opened=3, pages_opened=100, files_unopened=0
    ) == BatchRate(2.0, 0.0)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (None, "unknown yet"),
        (0.3, "any moment"),
        (42.4, "about 42 s"),
        (600, "about 10 min"),
        (3 * 3600 + 300, "about 3 h 5 min"),
        (7200, "about 2 h"),
    ],
)
def test_durations_in_words(seconds, words):
    assert format_duration(seconds) == words
