"""The embedding batcher's packing, order and errors, with a fake embedder (pure logic: the real
one is exercised by every ingest test through the worker)."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest

from documents.embedding_batcher import EmbeddingBatcher, _Request, take_batch


class FakeEncoder:
    """A fake embedder: each text's row is [its number, its length]; records every batch, can be
    held at its next call (``hold``) and made to fail on texts containing "boom"."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.held = threading.Event()
        self.held.set()
        self.entered = threading.Event()

    def hold(self) -> None:
        self.held.clear()

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        self.held.wait(10)
        self.batches.append(list(texts))
        if any("boom" in text for text in texts):
            raise ValueError("the embedder broke on this batch")
        return np.array([[float(text.split("-")[-1]), len(text)] for text in texts], dtype=np.float32)


def _texts(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


@pytest.fixture
def encoder():
    return FakeEncoder()


@pytest.fixture
def batcher(encoder):
    made = EmbeddingBatcher(encoder, batch_size=8)
    yield made
    encoder.held.set()
    made.stop()


def _in_thread(batcher, texts, results, key):
    def run():
        try:
            results[key] = batcher.embed(texts)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            results[key] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_queued(batcher, n: int) -> None:
    for _ in range(1000):
        with batcher._condition:
            if len(batcher._waiting) >= n:
                return
        threading.Event().wait(0.005)
    raise AssertionError(f"{n} requests never queued")


def test_each_caller_gets_its_own_rows_in_order(batcher):
    rows = batcher.embed(_texts("a", 20))  # longer than a batch: split over three
    assert rows[:, 0].tolist() == list(range(20))
    assert batcher.stats.batches == 3 and batcher.stats.texts == 20


def test_documents_waiting_together_are_embedded_in_full_batches(batcher, encoder):
    encoder.hold()
    results: dict = {}
    first = _in_thread(batcher, _texts("first", 2), results, "first")
    assert encoder.entered.wait(5)  # the embedder is busy with the first document's passages
    threads = []
    for n in range(4):  # one after another, so that they queue in this order
        threads.append(_in_thread(batcher, _texts(f"doc{n}", 3), results, n))
        _wait_queued(batcher, n + 1)
    encoder.held.set()
    for thread in [first, *threads]:
        thread.join(10)
    # Four documents of three passages waited meanwhile: one full batch of eight, then the rest.
    assert [len(batch) for batch in encoder.batches] == [2, 8, 4]
    assert encoder.batches[1] == [*_texts("doc0", 3), *_texts("doc1", 3), *_texts("doc2", 2)]
    for n in range(4):
        assert results[n][:, 0].tolist() == [0, 1, 2]
        assert results[n][:, 1].tolist() == [len(text) for text in _texts(f"doc{n}", 3)]
    assert batcher.stats.full_batches == 1 and batcher.stats.requests_per_batch_max == 3


def test_a_lone_document_is_not_held_back_to_fill_a_batch(batcher, encoder):
    rows = batcher.embed(_texts("alone", 3))
    assert rows.shape == (3, 2)
    assert [len(batch) for batch in encoder.batches] == [3]


def test_an_embedder_error_reaches_the_callers_of_that_batch_only(batcher, encoder):
    encoder.hold()
    results: dict = {}
    first = _in_thread(batcher, _texts("first", 8), results, "first")
    assert encoder.entered.wait(5)
    bad = _in_thread(batcher, ["boom-0", *_texts("bad", 9)], results, "bad")  # over two batches
    _wait_queued(batcher, 1)
    encoder.held.set()
    first.join(10)
    bad.join(10)
    later = batcher.embed(_texts("later", 2))
    assert isinstance(results["bad"], ValueError)
    assert results["first"][:, 0].tolist() == list(range(8))
    assert later[:, 0].tolist() == [0, 1]
    # The failed request's second half was never embedded.
    assert all("bad-8" not in batch for batch in encoder.batches)


def test_take_batch_splits_a_long_request_and_keeps_it_first():
    long, short = _Request(texts=_texts("long", 10), rows=[None] * 10), _Request(texts=["s-0"], rows=[None])
    waiting = deque([long, short])
    assert [(r is long, start, end) for r, start, end in take_batch(waiting, 4)] == [(True, 0, 4)]
    assert list(waiting) == [long, short]
    assert [(r is long, start, end) for r, start, end in take_batch(waiting, 8)] == [(True, 4, 10), (False, 0, 1)]
    assert not waiting


def test_a_stopped_batcher_refuses_new_work(encoder):
    batcher = EmbeddingBatcher(encoder, batch_size=4)
    batcher.embed(["x-1"])
    batcher.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        batcher.embed(["x-2"])


class FakeClock:
    """A fake clock and wait: time moves only when the rest waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def test_while_drafting_the_embedder_rests_so_that_it_embeds_its_share_of_the_time():
    from documents.embedding_batcher import YieldWhileDrafting

    clock, asked = FakeClock(), []
    rest = YieldWhileDrafting(lambda: asked.append(clock.now) or True, share=0.25, poll_s=0.5, clock=clock)
    assert rest(1.0, clock.wait) == pytest.approx(3.0)  # 1 s of 4 embedding
    assert max(clock.waits) <= 0.5 and len(asked) >= 6  # asked again every poll while resting


def test_the_rest_ends_when_drafting_stops_and_never_starts_without_it():
    from documents.embedding_batcher import YieldWhileDrafting

    clock = FakeClock()
    rest = YieldWhileDrafting(lambda: clock.now < 1.0, share=0.1, poll_s=0.5, clock=clock)
    assert rest(2.0, clock.wait) == pytest.approx(1.0)  # 18 s owed; drafting stopped after 1 s
    assert rest(2.0, clock.wait) == 0.0
    broken = YieldWhileDrafting(lambda: 1 / 0, share=0.1, clock=clock)  # an engine that does not answer
    assert broken(2.0, clock.wait) == 0.0
    never = YieldWhileDrafting(lambda: True, share=1.0, clock=clock)
    assert never(2.0, clock.wait) == 0.0


def test_the_batcher_rests_after_each_batch_and_a_stop_ends_the_rest(encoder):
    rests: list[float] = []
    started = threading.Event()

    def rest(busy_s: float, wait) -> float:
        rests.append(busy_s)
        started.set()
        wait(30)  # the stop below must end it at once
        return 30.0

    batcher = EmbeddingBatcher(encoder, batch_size=4, rest=rest)
    assert batcher.embed(_texts("a", 3)).shape == (3, 2)
    assert started.wait(5) and len(rests) == 1 and rests[0] >= 0
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive()


def test_the_idle_class_covers_the_batchers_thread_alone():
    """APPLIANCE_INGEST_CPU_CLASS=idle-embedding: the batcher's thread embeds in SCHED_IDLE (what
    encode runs in), and the threads that hand it passages keep the normal class."""
    import os

    from documents.embeddings import idle_thread

    seen: list[int] = []

    def encode(texts: list[str]) -> np.ndarray:
        seen.append(os.sched_getscheduler(0))
        return np.zeros((len(texts), 2), dtype=np.float32)

    batcher = EmbeddingBatcher(encode, batch_size=4, thread_setup=idle_thread)
    try:
        assert batcher.embed(["a-1", "a-2"]).shape == (2, 2)
    finally:
        batcher.stop()
    assert seen == [os.SCHED_IDLE]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_a_thread_setup_that_fails_leaves_the_batcher_embedding(encoder):
    def setup() -> None:
        raise PermissionError("no such class here")

    batcher = EmbeddingBatcher(encoder, batch_size=4, thread_setup=setup)
    try:
        assert batcher.embed(["x-1", "x-2"])[:, 0].tolist() == [1.0, 2.0]
    finally:
        batcher.stop()


def _class_recording_encoder(release: threading.Event | None = None):
    """A fake embedder that records the CPU class of the thread each batch runs on, at its start
    and (if ``release`` is given, once it is set) at its end; ``entered`` is set as a batch
    starts."""
    import os

    seen: list[tuple[int, int]] = []
    entered = threading.Event()

    def encode(texts: list[str]) -> np.ndarray:
        first = os.sched_getscheduler(0)
        entered.set()
        if release is not None:
            release.wait(10)
        seen.append((first, os.sched_getscheduler(0)))
        return np.zeros((len(texts), 2), dtype=np.float32)

    return encode, seen, entered


def test_while_drafting_each_batch_runs_in_the_class_the_signal_gives():
    """APPLIANCE_INGEST_CPU_CLASS=idle-while-drafting: a batch while the engine drafts runs in
    SCHED_IDLE, the next one after drafting ended in the normal class again (a new thread: one
    cannot leave the idle class without privilege); the batcher's thread and the callers' keep
    the normal class."""
    import os

    drafting = [True]
    encode, seen, _ = _class_recording_encoder()
    batcher = EmbeddingBatcher(encode, batch_size=4, idle_while=lambda: drafting[0], idle_poll_s=0.01)
    try:
        batcher.embed(["a-1", "a-2"])
        drafting[0] = False
        batcher.embed(["b-1"])
        assert batcher._thread is not None and batcher._thread.native_id is not None
        assert os.sched_getscheduler(batcher._thread.native_id) == os.SCHED_OTHER
    finally:
        batcher.stop()
    assert seen == [(os.SCHED_IDLE, os.SCHED_IDLE), (os.SCHED_OTHER, os.SCHED_OTHER)]
    assert batcher.stats.idle_batches == 1 and batcher.stats.batches == 2
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_a_batch_is_moved_to_the_idle_class_as_soon_as_drafting_starts():
    import os

    drafting = threading.Event()
    answered_yes = threading.Event()
    release = threading.Event()
    encode, seen, entered = _class_recording_encoder(release)

    def idle_while() -> bool:
        if drafting.is_set():
            answered_yes.set()
        return drafting.is_set()

    batcher = EmbeddingBatcher(encode, batch_size=4, idle_while=idle_while, idle_poll_s=0.01)
    result: list[np.ndarray] = []
    caller = threading.Thread(target=lambda: result.append(batcher.embed(["c-1", "c-2"])))
    try:
        caller.start()
        assert entered.wait(10)  # the batch runs, in the normal class
        drafting.set()
        assert answered_yes.wait(10)  # the batcher asked again, and moves it
        time.sleep(0.05)
        release.set()
        caller.join(10)
    finally:
        release.set()
        batcher.stop()
    assert result and result[0].shape == (2, 2)
    assert seen == [(os.SCHED_OTHER, os.SCHED_IDLE)]
    assert batcher.stats.idle_batches == 1


def test_a_signal_that_fails_leaves_the_batch_embedding_in_the_normal_class():
    import os

    def broken() -> bool:
        raise ConnectionRefusedError("no engine here")

    encode, seen, _ = _class_recording_encoder()
    batcher = EmbeddingBatcher(encode, batch_size=4, idle_while=broken, idle_poll_s=0.01)
    try:
        assert batcher.embed(["x-1", "x-2"]).shape == (2, 2)
    finally:
        batcher.stop()
    assert seen == [(os.SCHED_OTHER, os.SCHED_OTHER)]
    assert batcher.stats.idle_batches == 0


def test_an_idle_class_refused_leaves_the_batches_embedding(encoder, monkeypatch):
    """Where the idle class cannot be had (a container's policy), the batches embed in the normal
    class; what encode raises on its batch's thread still reaches the caller."""
    import documents.embedding_batcher as module

    def refused(thread_id: int) -> None:
        raise PermissionError("sched_setscheduler: operation not permitted")

    monkeypatch.setattr(module, "to_idle_class", refused)
    batcher = EmbeddingBatcher(encoder, batch_size=4, idle_while=lambda: True, idle_poll_s=0.01)
    try:
        assert batcher.embed(["x-1", "x-2"])[:, 0].tolist() == [1.0, 2.0]
        with pytest.raises(ValueError, match="broke on this batch"):
            batcher.embed(["boom-1"])
        assert batcher.embed(["y-3"])[:, 0].tolist() == [3.0]
    finally:
        batcher.stop()
    assert batcher.stats.idle_batches == 0 and batcher.stats.batches == 2


def test_recent_drafting_holds_for_a_while_after_drafting_and_asks_at_most_once_a_poll():
    """documents.embedding_batcher.RecentDrafting, with a fake clock and a fake engine's
    answers."""
    from documents.embedding_batcher import RecentDrafting

    now = [100.0]
    answers: list[float | None | Exception] = []
    asked: list[float] = []

    def idle_s() -> float | None:
        asked.append(now[0])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def at(t: float, answer: float | None | Exception) -> bool:
        now[0] = t
        answers[:] = [answer]
        return recent()

    recent = RecentDrafting(idle_s, hold_s=60, poll_s=0.5, clock=lambda: now[0])
    answers[:] = [None]
    assert recent() is False  # no draft since the engine started
    assert at(101, 0.0) is True  # drafting now
    answers[:] = [5.0]
    assert recent() is True and len(asked) == 2  # within the poll: not asked again
    assert at(160.5, 59.5) is True  # ended 59.5 s ago: still held
    assert at(162, 61.0) is False
    assert at(163, None) is False  # forgotten by the engine (restarted), and seen too long ago here
    assert at(200, 0.0) is True
    assert at(230, OSError("the engine host does not answer")) is True  # seen 30 s ago here
    assert at(235, None) is True  # restarted meanwhile: what was seen here still holds
    assert at(261, OSError("still not answering")) is False
    assert len(asked) == 9
