"""Pure parts of ``manage.py bench scheduling``: how the tuned baseline is chosen, and the
backlog poll that outlasts a database slow to take a connection (a fake query stands in)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError
from django.db import OperationalError

from measure import bench_scheduling


def _mode(*, meets: bool, per_minute: float, ttft: float) -> dict:
    return {"meets_drafting_bounds": meets, "documents": {"documents_per_minute": per_minute}, "ttft_p95_ratio": ttft}


def test_the_tuned_baseline_is_the_fastest_that_meets_the_bounds_else_the_most_responsive():
    modes = {
        "engine@0": _mode(meets=False, per_minute=9.0, ttft=41.0),
        "engine@256": _mode(meets=True, per_minute=4.0, ttft=1.9),
        "engine@512": _mode(meets=True, per_minute=5.0, ttft=1.8),
    }
    assert bench_scheduling._best_engine(modes) == "engine@512"
    del modes["engine@256"], modes["engine@512"]
    modes["engine@1024"] = _mode(meets=False, per_minute=12.0, ttft=54.0)
    assert bench_scheduling._best_engine(modes) == "engine@0"


class FakeJobs:
    """A fake of ``Job.objects`` whose first ``failures`` queries time out connecting."""

    def __init__(self, failures: int, unfinished: bool) -> None:
        self.failures, self.unfinished, self.calls = failures, unfinished, 0

    def filter(self, **_):
        return self

    def exclude(self, **_):
        return self

    def exists(self) -> bool:
        self.calls += 1
        if self.calls <= self.failures:
            raise OperationalError("connection timeout expired")
        return self.unfinished


def test_the_backlog_poll_asks_again_when_the_database_is_slow_to_connect(monkeypatch):
    import django.db

    from inference.models import Job

    monkeypatch.setattr(bench_scheduling.time, "sleep", lambda s: None)
    monkeypatch.setattr(django.db, "close_old_connections", lambda: None)  # no real connection to close here
    fake = FakeJobs(failures=2, unfinished=False)
    monkeypatch.setattr(Job, "objects", fake)
    assert bench_scheduling._unfinished(["a"]) is False and fake.calls == 3
    monkeypatch.setattr(Job, "objects", FakeJobs(failures=9, unfinished=True))
    with pytest.raises(OperationalError):  # a database that stays away ends the run, with its error
        bench_scheduling._unfinished(["a"])


class FakeMetrics:
    """A fake of one draft's ``RequestMetrics``: only the times the tail breakdown reads."""

    def __init__(self, ttft: float, queue: float, admission: float, prefill: float | None) -> None:
        self.ttft_ms, self.queue_wait_ms, self.admission_wait_ms, self.prefill_ms = ttft, queue, admission, prefill


class FakeJob:
    """A fake of a draft's ``Job``: its metrics and when it was created, sent and claimed."""

    def __init__(self, metrics: FakeMetrics, sending_ms: float | None = 5, taking_ms: float = 15) -> None:
        from datetime import UTC, datetime, timedelta

        self.metrics = metrics
        self.created_at = datetime(2026, 12, 4, tzinfo=UTC)
        self.dispatched_at = None if sending_ms is None else self.created_at + timedelta(milliseconds=sending_ms)
        self.claimed_at = self.created_at + timedelta(milliseconds=(sending_ms or 0) + taking_ms)


def test_the_ttft_tail_says_where_the_slowest_drafters_waited():
    fast = [FakeJob(FakeMetrics(400, 20, 0, 300)) for _ in range(19)]
    # Waited for a worker: the tail is the queue's, and of that the wait after its message was sent.
    slow = FakeJob(FakeMetrics(3400, 2900, 100, 300), sending_ms=40, taking_ms=2860)
    tail = bench_scheduling.ttft_tail([*fast, slow])
    assert tail["requests"] == 1 and tail["ttft_ms"] == 3400
    assert tail["queue_wait_ms"] == 2900 and tail["admission_wait_ms"] == 100 and tail["prefill_ms"] == 300
    assert tail["sending_ms"] == 40 and tail["taking_ms"] == 2860
    assert tail["other_ms"] == 100
    assert bench_scheduling.ttft_tail([]) == {"requests": 0}
    unsent = bench_scheduling.ttft_tail([FakeJob(FakeMetrics(400, 20, 0, 300), sending_ms=None)])
    assert "sending_ms" not in unsent and unsent["queue_wait_ms"] == 20  # sent by the watchdog: no split


def test_drafting_is_counted_present_while_any_draft_lives_not_once_per_draft():
    from datetime import UTC, datetime, timedelta

    at = datetime(2026, 12, 2, tzinfo=UTC)

    class Lived:  # a fake job: only when it was made and when it ended
        def __init__(self, start_s: float, end_s: float) -> None:
            self.created_at = at + timedelta(seconds=start_s)
            self.finished_at = at + timedelta(seconds=end_s)

    # Two overlapping bursts' drafts and one on its own: 0-5 s, 4-9 s (together 0-9), 20-22 s.
    jobs = [Lived(0, 5), Lived(4, 9), Lived(1, 3), Lived(20, 22)]
    assert bench_scheduling.busy_seconds(jobs) == 11.0
    assert bench_scheduling.busy_seconds([]) == 0.0


def _steady_repeat(alone: list[float], beside: list[float], documents_vs_fifo: float) -> dict:
    def figures(ttfts: list[float]) -> dict:
        return {
            "requests": len(ttfts),
            "ttft_ms_each": ttfts,
            "itl_p95_ms_each": [40.0] * len(ttfts),
            "ttft_p95_ms": bench_scheduling.percentile(ttfts, 95),
            "itl_p95_ms": 40.0,
        }

    ratio = figures(beside)["ttft_p95_ms"] / figures(alone)["ttft_p95_ms"]
    return {
        "steady": {
            "alone": figures(alone),
            "modes": {
                "appliance": {
                    "drafting": figures(beside),
                    "ttft_p95_ratio": ratio,
                    "itl_p95_ratio": 1.0,
                    "documents_vs_fifo": documents_vs_fifo,
                },
                "fifo": {
                    "drafting": figures(beside),
                    "ttft_p95_ratio": ratio,
                    "itl_p95_ratio": 1.0,
                    "documents_vs_fifo": 1.0,
                },  # fmt: skip
            },
        }
    }


def test_the_summary_gives_each_p95_ratio_over_the_repeats_requests_pooled_with_its_verdict():
    """Three repeats where drafting beside documents is 1.5x alone, and one repeat's drafting
    alone caught seven requests in a stall: the per-repeat interval cannot tell, the pooled
    ratio meets the 2x target, and the table prints both."""
    alone = [100.0 + i for i in range(120)]
    beside = [1.5 * v for v in alone]
    stalled = alone[:113] + [900.0] * 7
    repeats = [_steady_repeat(alone, beside, 0.5), _steady_repeat(alone, beside, 0.5),
               _steady_repeat(stalled, beside, 0.5)]  # fmt: skip
    summary = bench_scheduling.summarise(repeats)["steady"]
    appliance = summary["modes"]["appliance"]
    assert summary["verdict"]["ttft_ratio"] == "unclear"
    assert 1.3 < appliance["ttft_p95_ratio_pooled"]["mean"] < 1.7 and appliance["ttft_p95_ratio_pooled"]["n"] == 360
    assert summary["verdict"]["ttft_ratio_pooled"] == "met"
    assert appliance["itl_p95_ratio_pooled"]["mean"] == 1.0 and summary["verdict"]["itl_ratio_pooled"] == "met"
    results = {"engine": {}, "summary": {"steady": summary}, "repeats": repeats}
    lines = bench_scheduling.table(results)
    pooled_line = lines[lines.index("pooled over the repeats' requests (bootstrap 95 % interval):") + 1]
    assert pooled_line.split()[:2] == ["appliance", f"{appliance['ttft_p95_ratio_pooled']['mean']:.2f}"]


def _peak_repeat(max_per_minute: float, predicted_per_minute: float, *, predicted_failed: int = 0) -> dict:
    def run(per_minute: float, failed: int = 0) -> dict:
        return {"failed": failed, "preemptions": 0, "requests_per_minute": per_minute, "ttft_p95_ms": 900.0,
                "output_tokens_p50": 40, "at_max_tokens": 3}  # fmt: skip

    return {
        "peak": {
            "requests": 70,
            "fixed:appliance:max": run(20.0),
            "fixed:engine": run(19.0),
            "eos:appliance:max": run(max_per_minute),
            "eos:appliance:predicted": run(predicted_per_minute, predicted_failed),
        }
    }


@pytest.mark.parametrize(
    ("repeats", "shown"),
    [
        ([(30.0, 39.0), (31.0, 40.0), (29.0, 38.5)], "predicted"),  # about 1.3x, every repeat
        ([(30.0, 24.0), (31.0, 25.0), (29.0, 23.0)], "max"),
        ([(30.0, 36.0), (31.0, 27.0), (29.0, 31.0)], "neither"),  # the interval crosses 1
        ([(30.0, 39.0)], "neither"),  # one repeat: no interval
    ],
)
def test_the_peak_shows_a_reservation_only_when_its_interval_does(repeats, shown):
    summary = bench_scheduling.summarise([_peak_repeat(m, p) for m, p in repeats])
    assert summary["peak"]["reservation_shown"] == shown
    assert summary["peak"]["eos:appliance:max"]["output_tokens_p50"] == [40] * len(repeats)
    assert "the better default shown: " + shown in "\n".join(
        bench_scheduling.table({"summary": summary, "engine": {}, "parameters": {}, "repeats": []})
    )


def test_a_predicted_reservation_that_fails_requests_is_not_shown_better():
    summary = bench_scheduling.summarise([_peak_repeat(30.0, 39.0, predicted_failed=2) for _ in range(3)])
    assert summary["peak"]["reservation_shown"] == "neither"


def test_the_idle_phase_splits_the_engine_from_the_work_after_the_last_token():
    """``last_token_at``: created + TTFT + the rest of the output at its mean ITL, the latest of
    the jobs; the summary gives the ratio to raw vLLM up to that point beside the end-to-end one."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    def job(created_s: float, ttft_ms: float, tokens: int, itl_ms: float | None, requests: int = 1):
        metrics = SimpleNamespace(ttft_ms=ttft_ms, output_tokens=tokens, itl_mean_ms=itl_ms, engine_requests=requests)
        return SimpleNamespace(created_at=datetime.fromtimestamp(created_s, tz=UTC), metrics=metrics)

    jobs = [job(100.0, 2_000, 65, 50.0), job(101.0, 500, 11, 100.0)]
    assert bench_scheduling.last_token_at(jobs) == pytest.approx(105.2)  # 100 + 2 s + 64 x 50 ms
    assert bench_scheduling.last_token_at([*jobs, job(100.0, 100, 1, None)]) is None  # no ITL: unknown
    assert bench_scheduling.last_token_at([*jobs, job(100.0, 100, 9, 10.0, requests=2)]) is None  # sections
    repeats = [{"idle": {"vs_raw": v, "vs_raw_to_last_token": t}} for v, t in ((0.96, 1.0), (0.97, 0.99), (0.98, 1.01))]
    summary = bench_scheduling.summarise(repeats)
    assert summary["idle"]["vs_raw_to_last_token"]["mean"] == pytest.approx(1.0)
    printed = "\n".join(bench_scheduling.table({"summary": summary, "engine": {}, "parameters": {}, "repeats": []}))
    assert "up to the last token (without the summaries' checks and storing): 1" in printed


def test_the_step_times_line_names_each_plan_with_enough_steps():
    scheduler = {"step_times": {
        "drafting_running": {"steps": 400, "p50_ms": 61.0, "p95_ms": 88.5, "p95_over_model": 1.31},
        "document_floor": {"steps": 3, "p50_ms": 90.0, "p95_ms": 95.0, "p95_over_model": 1.4},
    }}  # fmt: skip
    assert bench_scheduling._step_times_line(scheduler) == "drafting_running 400: 61.0 / 88.5 (x1.31)"
    assert bench_scheduling._step_times_line({}) == ""  # an engine that reports none (an older one)


def test_the_step_times_line_shows_where_the_documents_tokens_were_read():
    scheduler = {"step_times": {
        "drafting_running": {"steps": 400, "p50_ms": 61.0, "p95_ms": 88.5, "p95_over_model": 1.31,
                             "document_tokens": 300},
        "drafting_gap": {"steps": 40, "p50_ms": 300.0, "p95_ms": 320.0, "p95_over_model": 1.1,
                         "document_tokens": 900},
        "document_floor": {"steps": 3, "p50_ms": 90.0, "p95_ms": 95.0, "p95_over_model": 1.4,
                           "document_tokens": 0},
    }}  # fmt: skip
    assert bench_scheduling._step_times_line(scheduler) == (
        "drafting_running 400: 61.0 / 88.5 (x1.31, 25% of documents), drafting_gap 40: 300.0 / 320.0 (x1.1, 75% of documents)"
    )


def test_the_steady_stream_is_sized_from_what_the_machine_was_measured_to_do():
    sizes = bench_scheduling.steady_sizes(capacity_per_s=0.9, documents_per_s=0.2, load=0.5, min_drafts=60)
    # Half the capacity; 60 drafts at 0.45/s take 133 s; x1.25 at 0.2 documents/s is 33.3.
    assert sizes == {"steady_rate": 0.45, "steady_documents": 34}
    # A faster machine: a faster stream, and a backlog that lasts as long in seconds.
    fast = bench_scheduling.steady_sizes(capacity_per_s=9.0, documents_per_s=2.0, load=0.5, min_drafts=60)
    assert fast == {"steady_rate": 4.5, "steady_documents": 34}
    # What is given is kept; the backlog follows a given rate; never fewer than asked.
    given = bench_scheduling.steady_sizes(capacity_per_s=0.9, documents_per_s=0.2, load=0.5, min_drafts=60, rate=1.5)
    assert given == {"steady_rate": 1.5, "steady_documents": 10}
    assert bench_scheduling.steady_sizes(capacity_per_s=0.9, documents_per_s=0.2, load=0.5, min_drafts=60,
                                         documents=7)["steady_documents"] == 7  # fmt: skip
    assert bench_scheduling.steady_sizes(capacity_per_s=9.0, documents_per_s=0.01, load=0.5, min_drafts=60,
                                         at_least=6)["steady_documents"] == 6  # fmt: skip
    with pytest.raises(ValueError, match="a rate of 0.0 drafts a second"):  # a machine too slow to measure
        bench_scheduling.steady_sizes(capacity_per_s=0.001, documents_per_s=0.2, load=0.25, min_drafts=60)


def test_the_steady_options_take_auto_or_a_positive_number():
    from measure.management.commands.bench import Command

    parser = Command().create_parser("manage.py", "bench")
    options = parser.parse_args(["scheduling"])
    assert (options.steady_rate, options.steady_documents, options.steady_load) == ("auto", "auto", 0.25)
    options = parser.parse_args(["scheduling", "--steady-rate", "0.8", "--steady-documents", "12"])
    assert (options.steady_rate, options.steady_documents) == (0.8, 12)
    for bad in (["--steady-rate", "fast"], ["--steady-rate", "0"], ["--steady-documents", "1.5"]):
        with pytest.raises((SystemExit, CommandError)):
            parser.parse_args(["scheduling", *bad])


class FakeEngineClient:
    """A fake of the engine host's client for policy switches: it keeps the policy as the host
    does (a setting not sent stays as it was) and records what each switch sent."""

    def __init__(self) -> None:
        self.policy = {"mode": "appliance", "chunk_fixed_cost_share": 0.5, "itl_slowdown": 1.4,
                       "long_prefill_token_threshold": 0}  # fmt: skip
        self.sent: list[tuple[str | None, dict]] = []

    def set_scheduling(self, scheduling=None, *, forget_output_lengths=False, **settings):
        self.sent.append((scheduling, settings))
        self.policy.update(settings, **({"mode": scheduling} if scheduling else {}))
        return {"scheduling": self.policy["mode"], "settings": dict(self.policy)}

    def reset_prefix_cache(self) -> None:
        pass


def test_a_variant_changes_the_schedulers_settings_for_its_own_runs_only():
    bench = object.__new__(bench_scheduling._Bench)  # no database, no engine: only the policy switches
    variant = "appliance:chunk_fixed_cost_share=0+itl_slowdown=1.2"
    bench.variants = bench_scheduling.variants("chunk_fixed_cost_share=0+itl_slowdown=1.2")
    bench._variant_defaults = None
    bench.best_engine = {}
    fake = FakeEngineClient()
    bench.client = lambda: fake
    assert bench._modes("steady", [0, 512]) == ["appliance", variant, "fifo", "engine@0", "engine@512"]
    assert bench._modes("eos", [0]) == ["appliance", "fifo", "engine@0"]  # beside the defaults in burst and steady
    bench._set_mode("appliance")
    defaults = dict(fake.policy)
    bench._set_mode(variant)
    assert fake.policy == {**defaults, "chunk_fixed_cost_share": 0, "itl_slowdown": 1.2}
    bench._set_mode("engine@512")
    assert fake.policy == {**defaults, "mode": "engine", "long_prefill_token_threshold": 512}
    bench._set_mode("appliance")  # the next repeat's drafting alone: the engine's own settings
    assert fake.policy == defaults


@pytest.mark.parametrize(
    "bad", ["nonsense=1", "mode=fifo", "long_prefill_token_threshold=512", "itl_slowdown", "itl_slowdown=0.5"]
)
def test_a_variant_must_be_a_setting_of_the_appliances_scheduler(bad):
    with pytest.raises(CommandError, match="--variants"):
        bench_scheduling.variants(bad)
    assert bench_scheduling.variants("") == {}


def test_the_bound_beside_drafting_follows_the_planners_rules_for_chunks():
    # The float32 AMD machine's fitted costs: a 67 ms step of three drafters, 37 ms more for
    # holding any prefill, 2.9 ms a prompt token; its 1.4x target leaves less than that fixed cost.
    from inference.engine.step_policy import StepCostModel, StepShape

    model = StepCostModel.from_coefficients((0.0495, 0.00536, 0.00668, 0.00288, 1.96, 0.0374))
    base = StepShape.of([600] * 3, [])
    target = 1.4 * model.predict(base)
    scheduler = {"draft_prompt_tokens": 64, "drafting_step_p95_ms": 280.0}

    def bound(share: float, **more) -> tuple[float, float]:
        config = {"chunk_fixed_cost_share": share, "itl_slowdown": 1.4}
        return bench_scheduling._Bench._tokens_beside_drafting(model, config, {**scheduler, **more}, base, target, 1250)

    every_step, tokens = bound(0.0)
    assert tokens == 4  # nothing fits in the target: the 4 tokens documents always read, at their cost
    assert every_step == pytest.approx(4 / model.predict(StepShape.of([600] * 3, [(1250, 4)])), rel=1e-3)
    saved_up, _ = bound(0.5)
    assert saved_up > 2 * every_step  # the fixed cost paid once a chunk
    # Drafters who felt only decode steps alone: chunks no longer than 1.4x those, so little is saved.
    assert bound(0.5, drafting_step_p95_ms=70.0)[0] < saved_up
    # Until that p95 is known the planner saves nothing up: a chunk every step.
    assert bound(0.5, drafting_step_p95_ms=None)[0] == pytest.approx(every_step)
