"""How fast a batch is being read and when it will be done, from what has been measured. Pure:
numbers in, numbers out, so that the batch page, the API and its stream say the same thing.

The rate is the batch's own: pages read (extracted and embedded) over the time since the batch
was made, so waiting behind other people's files counts, as it does for the person waiting. The
pages left are known for files already opened; for files not opened yet they are estimated from
their size, at the pages per byte measured on the batch's opened files of the same kind (a PDF
and a text file hold very different bytes per page), or of any kind when none of that kind has
been opened yet. Until a page has been read there is no rate, and until a file has been opened
no estimate of what is left: then the ETA is unknown (None), never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MIN_ELAPSED_S = 1.0  # a rate over less than this is noise


@dataclass(frozen=True)
class BatchRate:
    pages_per_s: float | None
    eta_s: float | None  # seconds until every file is read, at the measured rate


@dataclass(frozen=True)
class Sample:
    """Files of one kind: their bytes and pages (opened files), or their bytes (unopened)."""

    size_bytes: int
    pages: int = 0


def pages_of_unopened(opened: Mapping[str, Sample], unopened: Mapping[str, Sample]) -> float | None:
    """Pages the unopened files hold, estimated from their bytes per kind (None: nothing opened
    to measure pages per byte on, while files wait to be opened)."""
    if not any(sample.size_bytes for sample in unopened.values()):
        return 0.0
    all_bytes = sum(sample.size_bytes for sample in opened.values())
    all_pages = sum(sample.pages for sample in opened.values())
    if not all_bytes or not all_pages:
        return None
    total = 0.0
    for kind, waiting in unopened.items():
        measured = opened.get(kind)
        if measured is not None and measured.size_bytes and measured.pages:
            total += waiting.size_bytes * measured.pages / measured.size_bytes
        else:
            total += waiting.size_bytes * all_pages / all_bytes
    return total


def batch_rate(*, elapsed_s: float, pages_done: int, pages_left_known: int, pages_unopened: float | None) -> BatchRate:
    """``pages_done``: pages read so far over the batch's documents; ``pages_left_known``: pages
    not read yet of unfinished documents whose page count is known; ``pages_unopened``: the
    estimate for the files not opened yet (``pages_of_unopened``)."""
    rate = pages_done / elapsed_s if pages_done > 0 and elapsed_s >= MIN_ELAPSED_S else None
    if pages_unopened is None:
        return BatchRate(rate, None)
    pages_left = max(0, pages_left_known) + pages_unopened
    if pages_left <= 0:
        return BatchRate(rate, 0.0)
    if rate is None:
        return BatchRate(None, None)
    return BatchRate(rate, pages_left / rate)


def format_duration(seconds: float | None) -> str:
    """An ETA in words a person reads at a glance: "about 40 s", "about 12 min", "about 3 h 5 min"."""
    if seconds is None:
        return "unknown yet"
    if seconds < 1:
        return "any moment"
    if seconds < 90:
        return f"about {round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes} min" if minutes else f"about {hours} h"
