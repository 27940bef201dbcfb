"""How fast a batch is being read and when it will be done, from what has been measured. Pure:
numbers in, numbers out, so that the batch page, the API and its stream say the same thing.

The rate is the batch's own: pages read (extracted and embedded) over the time since the batch
was made, so waiting behind other people's files counts, as it does for the person waiting. The
pages left are known for files already opened; for files not opened yet they are estimated at
the mean page count of the files opened so far. Until a page has been read there is no rate, and
until a file has been opened no estimate of what is left: then the ETA is unknown (None), never
a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_ELAPSED_S = 1.0  # a rate over less than this is noise


@dataclass(frozen=True)
class BatchRate:
    pages_per_s: float | None
    eta_s: float | None  # seconds until every file is read, at the measured rate


def batch_rate(
    *,
    elapsed_s: float,
    pages_done: int,
    pages_left_known: int,
    files_opened: int,
    pages_opened: int,
    files_unopened: int,
) -> BatchRate:
    """``pages_done``: pages read so far over the batch's documents; ``pages_left_known``: pages
    not read yet of unfinished documents whose page count is known; ``files_opened`` /
    ``pages_opened``: documents whose page count is known and their pages (the sample for the
    mean); ``files_unopened``: unfinished documents whose page count is not known yet."""
    rate = pages_done / elapsed_s if pages_done > 0 and elapsed_s >= MIN_ELAPSED_S else None
    if pages_left_known <= 0 and files_unopened <= 0:
        return BatchRate(rate, 0.0)
    if files_unopened and not files_opened:
        return BatchRate(rate, None)
    mean_pages = pages_opened / files_opened if files_opened else 0.0
    pages_left = max(0, pages_left_known) + files_unopened * mean_pages
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
