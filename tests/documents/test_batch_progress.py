"""Pages per second and the ETA of a batch, from what was measured (``documents.batch_progress``)."""

from __future__ import annotations

import pytest

from documents.batch_progress import BatchRate, Sample, batch_rate, format_duration, pages_of_unopened


def test_rate_is_pages_read_over_time_and_eta_is_pages_left_at_that_rate():
    # 40 pages read in 20 s: 2 pages/s. Left: 10 pages of a file being read, and 60 estimated
    # for the files not opened yet: 70 pages, 35 s.
    assert batch_rate(elapsed_s=20, pages_done=40, pages_left_known=10, pages_unopened=60.0) == BatchRate(2.0, 35.0)


def test_unopened_files_are_estimated_from_their_bytes_at_the_pages_per_byte_of_their_kind():
    opened = {"pdf": Sample(size_bytes=400_000, pages=20), "text": Sample(size_bytes=30_000, pages=10)}
    # PDFs: 20 pages per 400 KB; text: 10 pages per 30 KB. A kind not opened yet (docx) goes at
    # the batch's overall 30 pages per 430 KB.
    unopened = {"pdf": Sample(size_bytes=200_000), "text": Sample(size_bytes=9_000), "docx": Sample(size_bytes=43_000)}
    assert pages_of_unopened(opened, unopened) == pytest.approx(10 + 3 + 3)
    assert pages_of_unopened(opened, {}) == 0.0
    assert pages_of_unopened({}, {"pdf": Sample(size_bytes=1)}) is None  # nothing measured yet


def test_no_rate_before_a_page_is_read_and_no_eta_before_a_file_is_opened():
    assert batch_rate(elapsed_s=30, pages_done=0, pages_left_known=12, pages_unopened=0.0) == BatchRate(None, None)
    too_short = batch_rate(elapsed_s=0.2, pages_done=5, pages_left_known=5, pages_unopened=0.0)
    assert too_short == BatchRate(None, None)
    unknown = batch_rate(elapsed_s=30, pages_done=10, pages_left_known=0, pages_unopened=None)
    assert unknown.pages_per_s == pytest.approx(10 / 30) and unknown.eta_s is None


def test_nothing_left_is_an_eta_of_zero():
    assert batch_rate(elapsed_s=50, pages_done=100, pages_left_known=0, pages_unopened=0.0) == BatchRate(2.0, 0.0)


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
