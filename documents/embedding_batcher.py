"""Passages of several documents embedded together, in full batches. No Django, no ORM.

The ingest worker reads several documents at once (a pool of threads: extraction runs in the
sandbox's child process, database writes wait on the socket), but there is one embedder per
process, and the embedder is what sets the pace. Each document's thread hands its passages to
the process's ``EmbeddingBatcher`` and waits; one thread of the batcher's own takes what is
waiting, across documents and in the order it came, fills a batch of ``batch_size`` passages, and
embeds it. A small document's five passages ride with the next one's fifty, so the embedder
mostly sees full batches; and while it embeds, the other threads extract, chunk and store, so
the rest of the ingest runs beside it instead of between its batches.

A batch is never held back to fill it: what waits is embedded as soon as the embedder is free,
so a lone document is not slowed down, and batches fill by themselves when documents queue.

Everything ``encode`` raises goes to each caller whose passages were in that batch; the batcher
keeps serving the others.

**Drafting first, if asked.** Where the embedder shares its device with the engine (both on the
CPU, or both on the GPU), a batch may slow the drafters' steps in ways no CPU priority governs
(caches, memory bandwidth, a GPU's compute). So the batcher can rest after each batch while the
engine runs drafting requests (``YieldWhileDrafting``), embedding only ``share`` of the time;
with nobody drafting, or with the embedder on another device, it never rests. Off by default:
on a 2-core CPU a share of 0.1 cut the ingest to a tenth while drafting ran, and drafting's TTFT
and ITL ratios did not measurably gain.

**Its CPU class.** ``thread_setup`` runs first in the batcher's own thread: the ingest worker
can use it to put the embedding, and nothing else, in Linux's idle CPU class for good
(``documents.embeddings.idle_thread``). Or the class can follow the engine's drafting
(``idle_while``): each batch is then embedded on a thread of its own, started by the batcher's
thread (which stays in the normal class and never embeds), in the idle class if ``idle_while()``
says so when it starts, and moved there as soon as it says so while the batch runs (asked every
``idle_poll_s``). A thread cannot leave the idle class without privilege (``RLIMIT_NICE``), but
a new thread starts in its creator's class: so a batch after drafting ended runs at the normal
class again. The embedding threads hold no database connection and no row lock, so a starved
batch delays the passages that wait for it; the process's other threads wait for it only while
it holds Python's interpreter lock (torch and the tokenizer let go of it while they compute).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

Encode = Callable[[list[str]], np.ndarray]  # texts -> (len(texts), dimensions) rows
# The seconds the last batch took -> rests (waits) as it sees fit, given a wait that returns True
# when the batcher is stopping; returns the seconds it rested.
Rest = Callable[[float, Callable[[float], bool]], float]


class Polled:
    """``ask()``'s latest answer, asked at most once per ``poll_s`` (each ask costs a call to the
    engine); what ``ask`` raises is answered by ``on_error()``."""

    def __init__(self, ask: Callable[[], bool], *, poll_s: float, on_error: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._ask = ask
        self._on_error = on_error
        self.poll_s = poll_s
        self._clock = clock
        self._asked_at: float | None = None
        self._answer = False

    def __call__(self) -> bool:
        now = self._clock()
        if self._asked_at is None or now - self._asked_at >= self.poll_s:
            try:
                self._answer = bool(self._ask())
            except Exception:  # noqa: BLE001 - the engine may be restarting, or starved
                self._answer = self._on_error()
            self._asked_at = self._clock()
        return self._answer


class RecentDrafting:
    """Whether this machine's engine runs drafting requests now, or did within ``hold_s``, from
    ``idle_s()`` (the seconds since drafting last ran there: 0 while it runs; None: none ran
    since the engine host started, or no engine here answers), asked at most once per ``poll_s``.
    When the engine does not answer (restarting, or starved by a saturated CPU), or has
    forgotten (restarted), the answer is what was last seen here: drafting seen within
    ``hold_s`` still counts."""

    def __init__(self, idle_s: Callable[[], float | None], *, hold_s: float, poll_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._idle_s = idle_s
        self.hold_s = hold_s
        self._clock = clock
        self._last_seen: float | None = None  # on ``clock``: when drafting last ran, as far as known
        self._polled = Polled(self._ask, poll_s=poll_s, on_error=self._remembered, clock=clock)

    def __call__(self) -> bool:
        return self._polled()

    def _ask(self) -> bool:
        idle_s = self._idle_s()
        if idle_s is not None:
            seen = self._clock() - idle_s
            self._last_seen = seen if self._last_seen is None else max(self._last_seen, seen)
        return self._remembered()

    def _remembered(self) -> bool:
        return self._last_seen is not None and self._clock() - self._last_seen <= self.hold_s


class YieldWhileDrafting:
    """The batcher's rest after a batch: while ``drafting()`` says the engine (on the embedder's
    device) runs drafting requests, wait so that embedding takes ``share`` of the time, asking
    again every ``poll_s`` and ending the rest as soon as drafting stops. ``drafting`` is asked at
    most once per ``poll_s``; what it raises counts as no."""

    def __init__(self, drafting: Callable[[], bool], *, share: float, poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.share = share
        self.poll_s = poll_s
        self.drafting_now = Polled(drafting, poll_s=poll_s, on_error=lambda: False, clock=clock)

    def __call__(self, busy_s: float, wait: Callable[[float], bool]) -> float:
        if self.share >= 1 or busy_s <= 0:
            return 0.0
        owed = busy_s * (1 - self.share) / self.share
        rested = 0.0
        while rested < owed and self.drafting_now():
            step = min(self.poll_s, owed - rested)
            stopping = wait(step)
            rested += step
            if stopping:
                break
        return rested


@dataclass
class _Request:
    texts: Sequence[str]
    rows: list[np.ndarray | None]
    taken: int = 0  # texts handed to a batch so far
    filled: int = 0  # texts whose rows came back
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class BatcherStats:
    batches: int = 0
    texts: int = 0
    full_batches: int = 0  # batches of exactly batch_size texts
    requests_per_batch_max: int = 0
    idle_batches: int = 0  # batches that ran (at least in part) in the idle CPU class (idle_while)

    @property
    def mean_batch(self) -> float:
        return self.texts / self.batches if self.batches else 0.0


class EmbeddingBatcher:
    """One embedder shared by the threads of a process, fed in full batches across callers."""

    def __init__(self, encode: Encode, *, batch_size: int, name: str = "embedding-batcher",
                 rest: Rest | None = None, thread_setup: Callable[[], None] | None = None,
                 idle_while: Callable[[], bool] | None = None, idle_poll_s: float = 0.2) -> None:  # fmt: skip
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._encode = encode
        self._rest = rest
        self._thread_setup = thread_setup  # run first in the batcher's own thread (its CPU class)
        self._idle_while = idle_while  # each batch on a thread of its own, idle while this says so
        self._idle_poll_s = idle_poll_s
        self._idle_refused = False  # the idle class could not be had here (logged once)
        self.batch_size = batch_size
        self._name = name
        self._waiting: deque[_Request] = deque()
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.stats = BatcherStats()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Rows for ``texts``, in order; blocks until they are embedded. Raises what the
        embedder raised on a batch that held any of them."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        request = _Request(texts=texts, rows=[None] * len(texts))
        with self._condition:
            if self._stopping:
                raise RuntimeError("the embedding batcher is stopped")
            self._start_locked()
            self._waiting.append(request)
            self._condition.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return np.stack([row for row in request.rows if row is not None])

    def stop(self) -> None:
        """Ends the batcher's thread once what waits is embedded (for tests and shutdown)."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _start_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()

    def _next_batch(self) -> list[tuple[_Request, int, int]] | None:
        """Slices (request, start, end) making the next batch, oldest request first; None when
        stopping with nothing waiting."""
        with self._condition:
            while not self._waiting:
                if self._stopping:
                    return None
                self._condition.wait()
            return take_batch(self._waiting, self.batch_size)

    def _serve(self) -> None:
        if self._thread_setup is not None:
            try:
                self._thread_setup()
            except Exception:  # the batcher embeds anyway, in the class it started in
                logger.exception("embedding batcher: its thread's setup failed")
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            texts = [text for request, start, end in batch for text in request.texts[start:end]]
            started = time.monotonic()
            try:
                if self._idle_while is None:
                    vectors, idle = self._encode(texts), False
                else:
                    vectors, idle = self._encode_in_class(texts)
                if len(vectors) != len(texts):
                    raise RuntimeError(f"the embedder gave {len(vectors)} rows for {len(texts)} texts")
            except BaseException as exc:  # noqa: BLE001 - handed to the callers, who raise it
                self._fail(batch, exc)
                continue
            self._record(batch, len(texts), idle=idle)
            row = 0
            for request, start, end in batch:
                for index in range(start, end):
                    request.rows[index] = vectors[row]
                    row += 1
                request.filled += end - start
                if request.filled == len(request.texts):
                    request.done.set()
            if self._rest is not None:
                self._rest(time.monotonic() - started, self._wait_unless_stopping)

    def _encode_in_class(self, texts: list[str]) -> tuple[np.ndarray, bool]:
        """``encode(texts)`` on a new thread: in the idle CPU class from its start if
        ``idle_while()`` says so, moved there the moment it does while the batch runs. Returns
        the rows and whether the batch ran (at least in part) in the idle class."""
        outcome: dict[str, Any] = {}
        idle_from_start = self._wants_idle()
        moved = threading.Event()

        def run() -> None:
            try:
                if idle_from_start and self._to_idle_class(0):
                    moved.set()
                outcome["vectors"] = self._encode(texts)
            except BaseException as exc:  # noqa: BLE001 - raised again in the batcher's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run, name=f"{self._name}-encode", daemon=True)
        thread.start()
        tried = idle_from_start
        thread.join(self._idle_poll_s)
        while thread.is_alive():  # never left before the batch ends: one encode at a time
            if not tried and self._wants_idle() and thread.is_alive():
                tried = True
                if self._to_idle_class(thread.native_id or 0):
                    moved.set()
            thread.join(self._idle_poll_s)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["vectors"], moved.is_set()

    def _wants_idle(self) -> bool:
        assert self._idle_while is not None
        try:
            return bool(self._idle_while())
        except Exception:  # noqa: BLE001 - a signal that fails leaves the batch in the normal class
            logger.exception("embedding batcher: could not tell whether to embed in the idle class")
            return False

    def _to_idle_class(self, thread_id: int) -> bool:
        """``to_idle_class(thread_id)``; False where it could not be done (the thread has just
        ended; a system without the class, or a container's policy that refuses it: then the
        batches embed in the normal class, and this is logged once)."""
        try:
            to_idle_class(thread_id)
            return True
        except ProcessLookupError:
            return False
        except (OSError, AttributeError) as exc:
            if not self._idle_refused:
                self._idle_refused = True
                logger.warning("embedding batcher: the idle CPU class is not available here (%s); "
                               "embedding in the normal class", exc)  # fmt: skip
            return False

    def _wait_unless_stopping(self, seconds: float) -> bool:
        """Waits ``seconds`` (less if the batcher is stopped meanwhile); True if it is stopping."""
        with self._condition:
            return self._condition.wait_for(lambda: self._stopping, timeout=seconds)

    def _fail(self, batch: list[tuple[_Request, int, int]], error: BaseException) -> None:
        with self._condition:
            for request, _, _ in batch:
                if request.error is None:
                    request.error = error
                try:  # the rest of a failed request is not embedded
                    self._waiting.remove(request)
                except ValueError:
                    pass
                request.done.set()

    def _record(self, batch: list[tuple[_Request, int, int]], size: int, *, idle: bool) -> None:
        stats = self.stats
        stats.batches += 1
        stats.idle_batches += idle
        stats.texts += size
        stats.full_batches += size == self.batch_size
        stats.requests_per_batch_max = max(stats.requests_per_batch_max, len(batch))


def to_idle_class(thread_id: int) -> None:
    """Put a thread of this process (``0``: the calling one) in Linux's idle CPU class,
    ``SCHED_IDLE``: almost no CPU while a thread of the normal class wants it. Threads it starts
    later inherit the class."""
    os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))


def take_batch(waiting: deque[_Request], batch_size: int) -> list[tuple[_Request, int, int]]:
    """Up to ``batch_size`` texts from the front of ``waiting``, oldest request first; a request
    longer than what is left of the batch is split, and stays at the front for the next one.
    Requests fully taken leave ``waiting``."""
    batch: list[tuple[_Request, int, int]] = []
    room = batch_size
    while waiting and room:
        request = waiting[0]
        start = request.taken
        end = min(len(request.texts), start + room)
        batch.append((request, start, end))
        request.taken = end
        room -= end - start
        if end == len(request.texts):
            waiting.popleft()
    return batch
