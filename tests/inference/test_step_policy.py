"""The scheduler's decisions, on a fake engine state (views of requests, no vLLM)."""

from __future__ import annotations

import random

import pytest

from inference.engine.step_policy import (
    KvState,
    Mode,
    OutputLengths,
    Planner,
    PolicyConfig,
    Reservation,
    RunningRequest,
    StepCostModel,
    StepPlan,
    StepShape,
    WaitingRequest,
    admit,
    blocks_for,
    refusal,
)

BLOCK = 16


def draft(rid: str, *, context: int = 100, user: str = "u1", arrival: float = 0.0) -> RunningRequest:
    return RunningRequest(rid, drafting=True, user=user, arrival=arrival, need_tokens=1, prefill_left=0,
                          context_tokens=context)  # fmt: skip


def document(rid: str, *, left: int, done: int = 0, user: str = "u1", arrival: float = 0.0) -> RunningRequest:
    return RunningRequest(rid, drafting=False, user=user, arrival=arrival, need_tokens=left, prefill_left=left,
                          context_tokens=done)  # fmt: skip


class FakeStepCosts:
    """A fake machine: a step costs 20 ms, 2 ms per decoding request, 0.1 ms per prefill token."""

    @staticmethod
    def seconds(shape: StepShape) -> float:
        return 0.020 + 0.002 * shape.decode_requests + 0.0001 * shape.prefill_tokens


def fitted_model(seed: int = 1) -> StepCostModel:
    rng = random.Random(seed)
    model = StepCostModel(window=256, refit_every=8, min_steps=16)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(0, 16), prefill_tokens=rng.choice([0, 0, 64, 256, 1024, 2048]))
        model.observe(shape, FakeStepCosts.seconds(shape) * rng.uniform(0.98, 1.02))
    return model


# --- configuration ----------------------------------------------------------------------------


def test_config_round_trips_and_refuses_nonsense():
    config = PolicyConfig(mode="engine", reservation="predicted", long_prefill_token_threshold=256)
    assert PolicyConfig.from_dict(config.to_dict()) == config
    assert config.updated({"mode": "appliance"}).mode is Mode.APPLIANCE
    assert config.updated({"mode": "appliance"}).long_prefill_token_threshold == 256
    with pytest.raises(ValueError):
        PolicyConfig.from_dict({"mode": "round-robin"})
    with pytest.raises(ValueError):
        PolicyConfig.from_dict({"slices": 3})
    with pytest.raises(ValueError):
        PolicyConfig(itl_slowdown=0.5)
    with pytest.raises(ValueError):
        PolicyConfig(idle_ramp_factor=0.5)  # a slow start that would shrink its steps
    with pytest.raises(ValueError):
        PolicyConfig(document_min_share=0.8)  # documents' floor would leave drafting little


# --- KV admission ----------------------------------------------------------------------------


def kv(free: int, *, total: int = 100, future: int = 0, slots: int = 32) -> KvState:
    return KvState(total_blocks=total, free_blocks=free, running_future_blocks=future, free_slots=slots)


def test_admission_counts_the_running_requests_future_and_stops_at_the_first_that_does_not_fit():
    config = PolicyConfig(kv_safety_factor=1.0, kv_decode_reserve_fraction=0.0)
    waiting = [
        WaitingRequest("a", drafting=True, user="u", reserve_blocks=30),
        WaitingRequest("b", drafting=False, user="u", reserve_blocks=40),  # does not fit beside a
        WaitingRequest("c", drafting=False, user="u", reserve_blocks=1),  # would fit, but waits behind b
    ]
    admitted, deferred, why = admit(waiting, kv(free=80, future=20), config)
    assert admitted == ["a"]
    assert deferred == {"b", "c"}
    assert why == {"b": "kv_budget", "c": "kv_budget"}
    # Without the running requests' future growth, b fits too.
    assert admit(waiting, kv(free=80, future=0), config)[0] == ["a", "b", "c"]


def test_documents_may_not_use_the_drafting_reserve():
    config = PolicyConfig(kv_safety_factor=1.0, kv_decode_reserve_fraction=0.2)  # 20 of 100 blocks
    document_request = [WaitingRequest("doc", drafting=False, user="u", reserve_blocks=30)]
    drafter = [WaitingRequest("draft", drafting=True, user="u", reserve_blocks=30)]
    assert admit(document_request, kv(free=45), config)[0] == []
    assert admit(drafter, kv(free=45), config)[0] == ["draft"]


def test_the_safety_factor_keeps_blocks_out_of_reach():
    config = PolicyConfig(kv_safety_factor=0.9, kv_decode_reserve_fraction=0.0)
    request = [WaitingRequest("a", drafting=True, user="u", reserve_blocks=95)]
    assert admit(request, kv(free=100), config)[0] == []
    assert admit([WaitingRequest("a", drafting=True, user="u", reserve_blocks=90)], kv(free=100), config)[0] == ["a"]


def test_admission_stops_when_the_engine_has_no_slot_left():
    waiting = [WaitingRequest(str(i), drafting=True, user="u", reserve_blocks=1) for i in range(5)]
    admitted, deferred, why = admit(waiting, kv(free=100, slots=2), PolicyConfig())
    assert admitted == ["0", "1"] and deferred == {"2", "3", "4"} and set(why.values()) == {"slots"}


def test_admission_counts_only_up_to_the_first_blocked_request():
    asked: list[str] = []

    def reserve(request: WaitingRequest) -> int:
        asked.append(request.request_id)
        return 60

    waiting = [WaitingRequest(str(i), drafting=True, user="u") for i in range(10)]
    admitted, _, _ = admit(waiting, kv(free=100), PolicyConfig(kv_safety_factor=1.0), reserve_blocks=reserve)
    assert admitted == ["0"]
    assert asked == ["0", "1"]  # the blocks of a long queue's tail are never counted


def test_a_request_that_is_not_ready_neither_starts_nor_blocks_others():
    waiting = [
        WaitingRequest("grammar", drafting=True, user="u", ready=False, reserve_blocks=1),
        WaitingRequest("next", drafting=True, user="u", reserve_blocks=1),
    ]
    admitted, deferred, _ = admit(waiting, kv(free=100), PolicyConfig())
    assert admitted == ["next"] and deferred == set()


def test_a_request_that_can_never_fit_is_refused_with_its_figures():
    config = PolicyConfig(kv_safety_factor=0.5, kv_decode_reserve_fraction=0.5)
    assert refusal(100, 100, drafting=True, total_blocks=100, block_size=BLOCK, config=config) is None
    reason = refusal(600, 100, drafting=False, total_blocks=100, block_size=BLOCK, config=config)
    assert reason is not None and "document" in reason and str(25 * BLOCK) in reason
    assert refusal(600, 100, drafting=True, total_blocks=100, block_size=BLOCK, config=config) is None


def test_predicted_reservations_use_what_requests_of_the_kind_wrote():
    lengths = OutputLengths(min_samples=10)
    assert lengths.reserve_output(drafting=True, max_tokens=512, reservation=Reservation.PREDICTED) == 512
    for n in range(1, 101):  # drafts that wrote 1..100 tokens
        lengths.record(drafting=True, output_tokens=n)
    assert lengths.predicted(drafting=True) == 90
    assert lengths.reserve_output(drafting=True, max_tokens=512, reservation=Reservation.PREDICTED) == 90
    assert lengths.reserve_output(drafting=True, max_tokens=64, reservation=Reservation.PREDICTED) == 64
    assert lengths.reserve_output(drafting=True, max_tokens=512, reservation=Reservation.MAX) == 512
    assert lengths.predicted(drafting=False) is None  # documents have their own history
    lengths.forget()
    assert lengths.predicted(drafting=True) is None
    assert lengths.reserve_output(drafting=True, max_tokens=512, reservation=Reservation.PREDICTED) == 512


def test_blocks_round_up():
    assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1 and blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2


# --- step costs ------------------------------------------------------------------------------


def test_the_cost_model_learns_a_machines_step_costs():
    model = fitted_model()
    shape = StepShape(decode_requests=8, prefill_tokens=512)
    assert model.predict(shape) == pytest.approx(FakeStepCosts.seconds(shape), rel=0.05)
    base = StepShape(decode_requests=8)
    target = 1.5 * FakeStepCosts.seconds(base)  # 54 ms against 36 ms: 18 ms, i.e. 180 tokens
    budget = model.prefill_budget(base, position=0, target_s=target)
    assert 160 <= budget <= 200
    assert model.prefill_budget(base, position=0, target_s=0.010) == 0  # no room at all


def test_the_cost_model_is_not_used_before_it_has_seen_enough_steps():
    model = StepCostModel(min_steps=32)
    for _ in range(10):
        model.observe(StepShape(decode_requests=4, prefill_tokens=100), 0.05)
    assert not model.ready and model.predict(StepShape(decode_requests=4)) is None


def test_attention_makes_a_late_chunk_costlier():
    model = StepCostModel(window=256, refit_every=8, min_steps=16)
    rng = random.Random(3)
    for _ in range(200):  # a fake machine whose prefill cost grows with the chunk's position
        start, tokens = rng.randint(0, 6000), rng.choice([64, 256, 1024])
        shape = StepShape.of([100] * 4, [(start, tokens)])
        model.observe(shape, 0.02 + 0.0001 * tokens + 2e-8 * tokens * (start + tokens / 2))
    base = StepShape.of([100] * 4, [])
    early = model.prefill_budget(base, position=0, target_s=0.06)
    late = model.prefill_budget(base, position=6000, target_s=0.06)
    assert late < early


# --- the plan --------------------------------------------------------------------------------


def planner(**config) -> Planner:
    return Planner(config=PolicyConfig(**config), max_budget_tokens=2048, cost=fitted_model())


def test_with_nobody_drafting_documents_get_the_whole_budget_when_asked_to():
    plan = planner(idle_throughput_loss=0).plan([document("d1", left=3000), document("d2", left=3000)], [], [], set())
    assert plan.reason == "no_drafting"
    assert plan.hold == frozenset() and plan.token_budget is None  # vLLM's own budget, for all of them


def efficiency(tokens: int, fixed_s: float, per_token_s: float) -> float:
    return tokens * per_token_s / (fixed_s + tokens * per_token_s)


def test_with_nobody_drafting_steps_are_as_short_as_a_2_percent_loss_of_speed_allows():
    # The fake machine above is GPU-like (a step's fixed cost is large beside its tokens'):
    # nearly the whole budget. A CPU-like one (30 ms a step, 3 ms a token): a fraction of it.
    gpu_like = planner().plan([document("d1", left=5000)], [], [], set())
    assert gpu_like.reason == "no_drafting" and 1500 <= gpu_like.token_budget < 2048
    assert efficiency(gpu_like.token_budget, 0.020, 0.0001) >= 0.98 * efficiency(2048, 0.020, 0.0001)

    cpu = StepCostModel(window=256, refit_every=8, min_steps=16)
    rng = random.Random(5)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(0, 4), prefill_tokens=rng.choice([0, 64, 512, 2048]))
        cpu.observe(shape, 0.030 + 0.002 * shape.decode_requests + 0.003 * shape.prefill_tokens)
    plan = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=cpu).plan(
        [document("d1", left=5000)], [], [], set()
    )
    assert 300 <= plan.token_budget <= 500  # a drafter who arrives waits ~1.2 s, not ~6 s
    assert efficiency(plan.token_budget, 0.030, 0.003) >= 0.98 * efficiency(2048, 0.030, 0.003) - 1e-6


def cpu_like_model() -> StepCostModel:
    """Fitted on a fake CPU-like machine: 40 ms a step, 2 ms per decoding request, 6.5 ms a prompt token."""
    cpu = StepCostModel(window=256, refit_every=8, min_steps=16)
    rng = random.Random(5)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(0, 4), prefill_tokens=rng.choice([0, 40, 64, 512, 2048]))
        cpu.observe(shape, 0.040 + 0.002 * shape.decode_requests + 0.0065 * shape.prefill_tokens)
    return cpu


def test_documents_arriving_at_an_idle_engine_start_slowly_then_reach_the_2_percent_step():
    # A backlog submitted at once: nothing runs yet, the documents wait to start. The first step
    # is as short as a drafter's own first step, each next one twice the one before, until the
    # 2 % rule's step: a drafter who arrives a moment later waits for a short step, not a long one.
    p = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=cpu_like_model())
    steady = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=cpu_like_model())
    full = steady.plan([document("doc0", left=8000)], [], [], set(), now=0.0).token_budget  # the 2 % rule
    assert full is not None and 200 < full < 600  # not 2048 tokens: a 13 s step on this machine
    backlog = [WaitingRequest(f"doc{i}", drafting=False, user="u1") for i in range(3)]
    first = p.plan([], backlog, [w.request_id for w in backlog], set(), now=0.0)
    assert first.reason == "slow_start"
    assert 0.040 + 0.0065 * first.token_budget <= (0.040 + 0.0065 * p.draft_prompt_tokens()) * 1.02
    budgets = [first.token_budget]
    for step in range(1, 8):
        plan = p.plan([document("doc0", left=8000, done=sum(budgets))], backlog[1:], [], set(), now=float(step))
        budgets.append(plan.token_budget)
    assert budgets[1] == 2 * budgets[0] and budgets[2] == 2 * budgets[1]
    assert budgets[-1] == full and max(budgets) == full  # it reaches the 2 % rule's step, never more
    # A drafter arriving while the engine starts up waits for the step in progress: never
    # longer than the time since the backlog arrived (plus the first, drafter-sized step).
    clock, starts = 0.0, []
    for tokens in budgets:
        starts.append((clock, 0.040 + 0.0065 * tokens))
        clock += starts[-1][1]
    first_step_s = starts[0][1]
    for arrival in (0.1, 0.5, 1.0, 2.0):
        start, length = next((t, d) for t, d in starts if t <= arrival < t + d)
        assert start + length - arrival <= arrival + first_step_s
    # The slow start costs the backlog only a few steps' fixed cost.
    assert budgets.index(full) <= 4
    # Off: the first step is the 2 % rule's.
    off = Planner(config=PolicyConfig(idle_ramp_factor=0), max_budget_tokens=2048, cost=cpu_like_model())
    assert off.plan([], backlog, [w.request_id for w in backlog], set(), now=0.0).token_budget == full
    # Drafters seen lately: the first step is a drafter's first step again, then the ramp goes
    # up to the gap step (on this slow machine, longer than a drafter's first step).
    p.plan([draft("d")], [], [], set(), now=20.0)
    gaps = [p.plan([], backlog, [], set(), now=21.0)]
    for step in range(1, 4):
        gaps.append(p.plan([document("doc0", left=8000, done=step * 100)], backlog[1:], [], set(), now=21.0 + step))
    assert gaps[0].reason == "slow_start" and gaps[0].token_budget <= budgets[0]
    assert gaps[-1].reason == "drafting_gap" and budgets[0] < gaps[-1].token_budget < full
    # Nothing to prefill (only decodes, or documents deferred): vLLM's own budget.
    assert p.plan([], backlog, [], {w.request_id for w in backlog}, now=100.0).token_budget is None


def test_a_fresh_engine_holds_documents_to_small_steps_until_it_can_price_a_prompt_token():
    # Nothing fitted yet, or a fit from drafting alone (no prefill coefficient): documents alone
    # would take vLLM's whole budget, seconds on a CPU, that a burst's first drafters all wait
    # for (seen in the burst benchmark). They take small steps while the model learns, for at
    # most max_calibration_steps (a model that never learns does not hold documents for ever).
    drafting_only = StepCostModel.from_coefficients((0.03, 0.002, 0.0, 0.0, 0.0))
    for cost in (StepCostModel(), drafting_only):
        p = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=cost)
        plans = [p.plan([document("doc0", left=50000)], [], [], set(), now=float(i)) for i in range(80)]
        assert {plan.reason for plan in plans[: p.max_calibration_steps]} == {"calibrating"}
        assert {plan.token_budget for plan in plans[: p.max_calibration_steps]} == {32, p.unfitted_chunk_tokens}
        assert plans[-1].reason != "calibrating"
    # The fit learns what a prompt token costs: the ordinary rules take over at once.
    learning = StepCostModel(window=256, refit_every=8, min_steps=16)
    p = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=learning)
    reasons = []
    for i in range(60):
        plan = p.plan([document("doc0", left=50000)], [], [], set(), now=float(i))
        reasons.append(plan.reason)
        shape = StepShape(prefill_tokens=plan.document_budget_tokens or 2048)
        learning.observe(shape, 0.040 + 0.003 * shape.prefill_tokens * (1 + 0.01 * (i % 3)))
    # then a slow start (the engine got busy moments ago), then the 2 % rule
    assert reasons[0] == "calibrating" and reasons[reasons.index("slow_start") - 1] == "calibrating"
    assert reasons.index("slow_start") <= 20 and reasons[-1] == "no_drafting"


def test_a_slow_start_holds_when_the_cost_model_cannot_size_a_documents_step_yet():
    # A fit that prices prompt tokens but shows no fixed step cost: the 2 % rule cannot tell, so
    # documents would take vLLM's whole budget at once. They start small, then take it.
    backlog = [WaitingRequest(f"doc{i}", drafting=False, user="u1") for i in range(6)]
    no_fixed = StepCostModel.from_coefficients((0.0, 0.002, 0.0, 0.0025, 3.0))
    for cost in (no_fixed,):
        p = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=cost)
        budgets = [p.plan([], backlog, [w.request_id for w in backlog], set(), now=0.0).token_budget]
        done = budgets[0]
        for step in range(1, 12):
            plan = p.plan([document("doc0", left=15000 - done, done=done)], backlog[1:], [], set(), now=float(step))
            budgets.append(plan.token_budget)
            done += plan.token_budget or 2048
        assert budgets[0] <= 64 and budgets[1] == 2 * budgets[0]
        assert None in budgets and all(b is None for b in budgets[budgets.index(None) :])  # then vLLM's budget
        assert budgets.index(None) <= 7


def test_when_the_last_drafter_leaves_documents_start_slowly_again():
    # Documents ran beside drafters in small chunks; the drafters finish. The next documents-only
    # step is a drafter's first step, each next one twice the one before, up to the step allowed
    # (here, with no window of recent drafting, the 2 % rule's): a drafter who arrives t seconds
    # after the others left waits for a step of about t at most.
    p = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=cpu_like_model())
    steady = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=cpu_like_model())
    full = steady.plan([document("doc0", left=8000)], [], [], set(), now=0.0).token_budget
    for i in range(5):  # drafters of 40-token prompts come and go beside the document
        drafter = RunningRequest(f"draft{i}", drafting=True, user="u2", arrival=float(i), need_tokens=40,
                                 prefill_left=40, context_tokens=0)  # fmt: skip
        beside = p.plan([drafter, document("doc0", left=8000)], [], [], set(), now=float(i))
        assert beside.reason == "drafting_running"
    budgets, reasons = [], []
    for step in range(8):
        plan = p.plan([document("doc0", left=8000, done=sum(budgets))], [], [], set(), now=5.0 + step)
        budgets.append(plan.token_budget)
        reasons.append(plan.reason)
    assert reasons[0] == "slow_start"
    assert 0.040 + 0.0065 * budgets[0] <= (0.040 + 0.0065 * 40) * 1.02  # a drafter's first step
    assert budgets[1] == 2 * budgets[0] and budgets[2] == 2 * budgets[1]
    assert budgets[-1] == full and max(budgets) == full and budgets.index(full) <= 5
    assert reasons[-1] == "no_drafting"
    # A drafter between: the ramp starts again from a drafter's first step when it leaves.
    p.plan([draft("again"), document("doc0", left=4000)], [], [], set(), now=20.0)
    assert p.plan([document("doc0", left=4000)], [], [], set(), now=21.0).token_budget == budgets[0]
    # Off: straight back to the 2 % rule's step.
    config = PolicyConfig(idle_ramp_factor=0, drafting_recent_s=0)
    off = Planner(config=config, max_budget_tokens=2048, cost=cpu_like_model())
    off.plan([draft("d"), document("doc0", left=8000)], [], [], set(), now=0.0)
    assert off.plan([document("doc0", left=8000)], [], [], set(), now=1.0).token_budget == full


def test_between_drafters_a_documents_step_is_no_longer_than_a_drafters_first_step_under_a_ttft_bound_of_1x():
    # ttft_slowdown 1: a drafter arriving in a gap may wait no longer than one arriving beside
    # drafting alone, so the gap step is a decode step, and a drafter's first step is longer.
    p = Planner(config=PolicyConfig(ttft_slowdown=1.0), max_budget_tokens=2048, cost=cpu_like_model())
    alone = [document("d1", left=8000)]
    quiet = p.plan(alone, [], [], set(), now=0.0)  # no drafter seen yet: the 2 % rule
    assert quiet.reason == "no_drafting" and quiet.token_budget > 200  # ~270 tokens: a 1.8 s step
    # Drafters of 40-token prompts come and go...
    for i in range(5):
        drafter = RunningRequest(f"draft{i}", drafting=True, user="u2", arrival=float(i), need_tokens=40,
                                 prefill_left=40, context_tokens=0)  # fmt: skip
        p.plan([drafter, *alone], [], [], set(), now=100.0 + i)
    assert p.draft_prompt_tokens() == 40
    gap = p.plan(alone, [], [], set(), now=110.0)  # 6 s after the last one
    assert gap.reason == "drafting_gap"
    # ...so a step of documents alone takes no longer than a drafter's own first step would.
    assert 0.040 + 0.0065 * gap.token_budget <= (0.040 + 0.0065 * 40) * 1.02
    assert gap.token_budget >= 30  # and documents still progress in it
    # Drafting stopped half a minute ago: steps ramp from the gap's to the 2 % rule's, doubling,
    # rather than jump to it (a drafter arriving then would wait for a whole long step).
    later = [p.plan(alone, [], [], set(), now=104.0 + 31 + i) for i in range(8)]
    assert later[0].reason == "slow_start" and later[0].token_budget == 2 * gap.token_budget
    assert later[1].token_budget == 4 * gap.token_budget
    assert later[-1].reason == "no_drafting" and later[-1].token_budget == quiet.token_budget
    assert max(plan.token_budget for plan in later) == quiet.token_budget
    off = Planner(config=PolicyConfig(drafting_recent_s=0), max_budget_tokens=2048, cost=cpu_like_model())
    off.plan([draft("d"), *alone], [], [], set(), now=0.0)
    assert off.plan(alone, [], [], set(), now=1.0).reason == "slow_start"  # only the slow start then


def this_cpu_model() -> StepCostModel:
    """Fitted on a fake of this development CPU in bfloat16: a step costs 31 ms and 0.65 ms a
    prompt token, 2 ms a decoding request."""
    rng = random.Random(3)
    model = StepCostModel(window=256, refit_every=8, min_steps=16)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(0, 4), prefill_tokens=rng.choice([0, 40, 64, 512, 2048]))
        model.observe(shape, 0.031 + 0.002 * shape.decode_requests + 0.00065 * shape.prefill_tokens)
    return model


def _gap_plans(config: PolicyConfig) -> list[StepPlan]:
    """A planner that has seen three drafters of 40-token prompts, then documents alone: its next
    ten plans."""
    p = Planner(config=config, max_budget_tokens=2048, cost=this_cpu_model())
    alone = [document("d1", left=50000)]
    for i in range(3):
        drafter = RunningRequest(f"draft{i}", drafting=True, user="u2", arrival=float(i), need_tokens=40,
                                 prefill_left=40, context_tokens=0)  # fmt: skip
        p.plan([drafter, *alone], [], [], set(), now=float(i))
    return [p.plan(alone, [], [], set(), now=5.0 + i) for i in range(10)]


def test_between_drafters_a_documents_step_takes_the_gap_step_the_ttft_target_allows():
    # A drafter's first step is short here (~57 ms for 40 tokens): holding documents to it would
    # halve their speed in every gap. A step may take the gap step, reached by a slow start from
    # a drafter's first step once the drafters have left; never the 2 % rule's 0.7 s step.
    def cost(tokens: int) -> float:
        return 0.031 + 0.00065 * tokens

    full = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=this_cpu_model()).plan(
        [document("d1", left=50000)], [], [], set(), now=0.0
    )
    assert cost(full.token_budget) > 0.6  # the 2 % rule's step, with nobody drafting lately
    # The default: a drafter arriving as a gap step begins waits for it and its own first step
    # (f), one arriving beside drafting alone for a decode step (d) and its first step; the gap
    # step keeps the first within 2x the second: gap = 2 d + f.
    decode, first = 0.031 + 0.002, cost(40)
    plans = _gap_plans(PolicyConfig())
    assert plans[0].reason == "slow_start" and cost(plans[0].token_budget) <= first * 1.05  # a drafter's first step
    assert plans[1].token_budget == 2 * plans[0].token_budget
    assert plans[-1].reason == "drafting_gap"
    assert (2 * decode + first) * 0.99 <= cost(plans[-1].token_budget) <= 2 * decode + first
    # A looser TTFT bound allows a longer step: 3 d + 2 f.
    looser = _gap_plans(PolicyConfig(ttft_slowdown=3.0))[-1]
    assert (3 * decode + 2 * first) * 0.99 <= cost(looser.token_budget) <= 3 * decode + 2 * first
    # gap_step_ms, when set, is the gap step
    fixed = _gap_plans(PolicyConfig(gap_step_ms=250))[-1]
    assert fixed.reason == "drafting_gap" and 0.25 * 0.99 <= cost(fixed.token_budget) <= 0.25
    # ttft_slowdown 1: held to a drafter's first step (longer than a decode step)
    held = _gap_plans(PolicyConfig(ttft_slowdown=1.0))[-1]
    assert held.reason == "drafting_gap" and cost(held.token_budget) <= first * 1.05


def test_with_no_fixed_step_cost_in_the_model_documents_keep_vllms_whole_budget():
    # A fit that dropped its intercept would make 4-token chunks look free: a document of 8,000
    # tokens would take 2,000 steps. vLLM's own budget is kept instead.
    no_fixed = StepCostModel.from_coefficients((0.0, 0.002, 0.0, 0.0025, 3.0))
    plan = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=no_fixed).plan(
        [document("d1", left=8000)], [], [], set()
    )
    assert plan.reason == "no_drafting" and plan.token_budget is None


def test_a_drafter_that_can_start_holds_document_prefill_back_for_its_step():
    waiting = [WaitingRequest("new-draft", drafting=True, user="u2"), WaitingRequest("doc3", drafting=False, user="u1")]
    running = [document("d1", left=3000), draft("old-draft"), document("d2", left=0, done=900)]
    plan = planner().plan(running, waiting, ["new-draft", "doc3"], set())
    assert plan.reason == "drafting_waiting"
    assert plan.hold == {"d1"}  # held, not preempted: a document decoding keeps its token
    assert "doc3" in plan.defer and "new-draft" not in plan.defer
    assert plan.order[0] == "old-draft"


def test_beside_running_drafts_documents_get_what_the_itl_target_leaves():
    p = planner(itl_slowdown=1.5)
    running = [draft(f"draft{i}") for i in range(8)] + [document("d1", left=5000)]
    plan = p.plan(running, [], [], set())
    assert plan.reason == "drafting_running" and not plan.hold
    documents = plan.document_budget_tokens
    assert plan.token_budget == 8 + documents
    # The step with the document chunk stays within 1.5x the drafting step alone, and uses most of it.
    alone = FakeStepCosts.seconds(StepShape(decode_requests=8))
    with_documents = FakeStepCosts.seconds(StepShape(decode_requests=8, prefill_tokens=documents))
    assert 1.35 * alone <= with_documents <= 1.55 * alone


def answering(rid: str, *, context: int = 2600, arrival: float = 0.0) -> RunningRequest:
    """A document past its prefill, writing its answer: one decode token a step."""
    return RunningRequest(rid, drafting=False, user="u1", arrival=arrival, need_tokens=1, prefill_left=0,
                          context_tokens=context)  # fmt: skip


def step_seconds(plan, running: list[RunningRequest]) -> float:
    """What the fake machine takes for the step ``plan`` makes of ``running``."""
    decoding = [r for r in running if r.prefill_left == 0 and r.request_id not in plan.hold]
    return FakeStepCosts.seconds(
        StepShape(decode_requests=len(decoding), prefill_tokens=plan.document_budget_tokens or 0)
    )


class FakeEpycCosts:
    """A fake of the 2-core AMD EPYC where documents' decodes took drafters' ITL p95 to 1.85x:
    a step costs 47 ms, 3.7 ms per decoding request and 1.35 ms per 1,000 tokens of their
    contexts, 0.43 ms a prompt token, and 5 ms more with any prefill in it."""

    @staticmethod
    def seconds(shape: StepShape) -> float:
        prefill = 0.005 + 0.00043 * shape.prefill_tokens if shape.prefill_tokens else 0.0
        return 0.047 + 0.0037 * shape.decode_requests + 0.00135 * shape.decode_context_tokens / 1e3 + prefill


def epyc_planner(**config) -> Planner:
    rng = random.Random(7)
    model = StepCostModel(window=256, refit_every=8, min_steps=16)
    for _ in range(200):
        contexts = [rng.choice([100, 2600]) for _ in range(rng.randint(0, 14))]
        shape = StepShape.of(contexts, [(0, n)] if (n := rng.choice([0, 0, 4, 32, 256, 1024])) else [])
        model.observe(shape, FakeEpycCosts.seconds(shape))
    return Planner(config=PolicyConfig(**config), max_budget_tokens=2048, cost=model)


def held_in_a_row(plans, request_id: str) -> int:
    longest = run = 0
    for plan in plans:
        run = run + 1 if request_id in plan.hold else 0
        longest = max(longest, run)
    return longest


def test_documents_writing_their_answers_share_what_the_itl_target_leaves_and_take_turns():
    # Six documents decoding with their 2,600-token contexts beside eight drafters would make
    # each step 1.5x the drafters' alone before any prefill: as many run as the 1.4x target
    # leaves room for beside the prefill chunk documents always read, the others in turn (a
    # chunk every step: saved up, a chunk's step is longer by design, see below).
    p = epyc_planner(chunk_fixed_cost_share=0)
    answers = [answering(f"doc{i}", arrival=i) for i in range(6)]
    drafters = [draft(f"draft{i}") for i in range(8)]
    running = drafters + answers + [document("d7", left=5000, done=2000)]
    alone = FakeEpycCosts.seconds(StepShape.of([100] * 8, []))
    plans = [p.plan(running, [], [], set()) for _ in range(24)]
    for plan in plans:
        kept = [r for r in answers if r.request_id not in plan.hold]
        assert plan.reason == "drafting_running" and plan.hold <= {r.request_id for r in answers}
        assert 1 <= len(kept) < 6
        assert plan.document_budget_tokens >= p.min_chunk_tokens
        assert plan.token_budget == 8 + len(kept) + plan.document_budget_tokens
        step = StepShape.of([100] * 8 + [r.context_tokens for r in kept], [(2000, plan.document_budget_tokens)])
        assert FakeEpycCosts.seconds(step) <= 1.45 * alone
    fewest = min(6 - len(plan.hold) for plan in plans)
    assert all(held_in_a_row(plans, r.request_id) <= -(-6 // fewest) for r in answers)  # in turn
    # A drafter's first step: documents' prefill held, their decodes (ten now) within that
    # step's target.
    more = [answering(f"doc{i}", arrival=i) for i in range(10)]
    waiting = [WaitingRequest("new-draft", drafting=True, user="u2")]
    first = p.plan([*drafters, *more, document("d7", left=5000)], waiting, ["new-draft"], set())
    assert first.reason == "drafting_waiting" and "d7" in first.hold
    kept = [r.context_tokens for r in more if r.request_id not in first.hold]
    with_prompt = StepShape.of([100] * 8, [(0, p.draft_prompt_tokens())])
    assert 1 <= len(kept) < 10
    step = StepShape.of([100] * 8 + kept, [(0, p.draft_prompt_tokens())])
    assert FakeEpycCosts.seconds(step) <= 1.45 * FakeEpycCosts.seconds(with_prompt)
    # Nobody drafting: every document decodes; nor does a model that cannot tell hold any.
    assert not p.plan(answers + [document("d7", left=5000)], [], [], set()).hold
    blind = Planner(config=PolicyConfig(), max_budget_tokens=2048)
    assert not blind.plan(running, [], [], set()).hold


def test_beside_drafting_no_step_has_room_for_a_document_decode_at_least_one_runs_in_turn():
    p = planner(itl_target_ms=1)  # no step can meet it
    answers = [answering(f"doc{i}") for i in range(5)]
    plans = [p.plan([draft("a"), *answers], [], [], set()) for _ in range(10)]
    assert all(len(plan.hold) == 4 for plan in plans)
    assert [r.request_id for plan in plans for r in answers if r.request_id not in plan.hold] == [
        f"doc{i % 5}" for i in range(10)
    ]


def test_documents_decodes_are_their_progress_and_keep_their_floor_away():
    # What drafting leaves goes to documents' decodes, 4 prompt tokens besides: their share of
    # the engine is the decodes', and no floor step comes to make it up.
    p = planner()
    running = [draft(f"draft{i}") for i in range(8)] + [answering(f"doc{i}") for i in range(12)]
    running.append(document("d13", left=50_000))
    plans = [p.plan(running, [], [], set()) for _ in range(200)]
    assert "document_floor" not in {plan.reason for plan in plans}
    assert 0.2 <= p.document_share() <= 0.35
    # One document decoding cannot use what drafting leaves: prefill has the rest.
    q = planner()
    plan = q.plan(
        [draft(f"draft{i}") for i in range(8)] + [answering("doc0"), document("d13", left=5000)], [], [], set()
    )
    assert not plan.hold and plan.document_budget_tokens > 100


def test_an_absolute_itl_target_replaces_the_slowdown():
    running = [draft("a"), document("d1", left=5000)]
    loose = planner(itl_target_ms=300).plan(running, [], [], set()).document_budget_tokens
    tight = planner(itl_slowdown=1.1).plan(running, [], [], set()).document_budget_tokens
    assert loose == 2048 and tight < loose  # 300 ms fits a whole step of prefill here


def test_documents_always_progress_beside_drafting():
    # A target no step can meet: documents still read about min_chunk_tokens a step, every step
    # (chunk_fixed_cost_share 0) or saved up into fewer, larger chunks.
    for share in (0.0, 0.1):
        p = planner(itl_target_ms=1, chunk_fixed_cost_share=share, document_min_share=0)
        plans = [p.plan([draft("a"), document("d1", left=5000)], [], [], set()) for _ in range(300)]
        tokens = [plan.document_budget_tokens for plan in plans]
        assert sum(tokens) >= 0.9 * 300 * p.min_chunk_tokens > 0  # the last saving may not be spent yet
        assert share or set(tokens) == {p.min_chunk_tokens}


def documents_share(plans, running_drafters: int) -> float:
    """Documents' share of the fake machine's time over ``plans`` (each a step beside
    ``running_drafters`` decoding)."""
    steps = [
        FakeStepCosts.seconds(StepShape(decode_requests=running_drafters, prefill_tokens=p.document_budget_tokens or 0))
        for p in plans
    ]
    alone = FakeStepCosts.seconds(StepShape(decode_requests=running_drafters))
    return sum(step - alone for step in steps) / sum(steps)


def test_when_drafting_fills_the_engine_documents_keep_their_floor():
    # A target no step beside 24 drafters can meet (an overloaded office): without a floor
    # documents read 4 tokens a step, a sliver of the engine; with it, about a fifth.
    running = [draft(f"draft{i}") for i in range(24)] + [document("d1", left=50_000)]
    starved = planner(itl_target_ms=1, document_min_share=0)
    floored = planner(itl_target_ms=1)
    without = [starved.plan(running, [], [], set()) for _ in range(300)]
    with_floor = [floored.plan(running, [], [], set()) for _ in range(300)]
    assert documents_share(without, 24) < 0.05
    assert 0.18 <= documents_share(with_floor, 24) <= 0.3
    assert floored.document_share() == pytest.approx(0.2, abs=0.03)  # what the planner estimated
    reasons = {p.reason for p in with_floor}
    # The floor in some steps, not all (the others hold a chunk or save up for one).
    assert "document_floor" in reasons and reasons - {"document_floor"} <= {"drafting_running", "drafting_saving"}
    assert len(reasons) > 1
    # A floor step takes 1.5 x the floor's share of its step: the ITL the drafters pay for it.
    floor_steps = [p for p in with_floor if p.reason == "document_floor"]
    assert 0.2 < documents_share(floor_steps, 24) <= 0.32


def test_where_the_itl_target_leaves_documents_more_than_their_floor_the_floor_changes_nothing():
    running = [draft(f"draft{i}") for i in range(8)] + [document("d1", left=50_000)]
    p, q = planner(), planner(document_min_share=0)
    plans = [p.plan(running, [], [], set()) for _ in range(200)]
    assert [plan.document_budget_tokens for plan in plans] == [
        q.plan(running, [], [], set()).document_budget_tokens for _ in range(200)
    ]
    assert "document_floor" not in {plan.reason for plan in plans}


def test_a_stream_of_drafters_starting_does_not_hold_documents_below_their_floor():
    # A new drafter can start at every step (an office of many drafters, each a few tokens
    # long): each step would hold documents back for it.
    def steps(p: Planner) -> list:
        plans = []
        for i in range(300):
            waiting = [WaitingRequest(f"new{i}", drafting=True, user="u2")]
            plans.append(p.plan([draft("a"), draft("b"), document("d1", left=50_000)], waiting, [f"new{i}"], set()))
        return plans

    held = steps(planner(document_min_share=0))
    assert {p.reason for p in held} == {"drafting_waiting"}
    floored = steps(planner())
    assert documents_share(floored, 2) >= 0.18
    # Drafters still start in a third of the steps (all those waiting then start at once):
    # documents take their floor in the others.
    assert 0.3 <= sum(p.reason == "drafting_waiting" for p in floored) / len(floored) < 0.5


def test_a_drafter_waiting_through_documents_floor_steps_is_not_taken_for_one_vllm_does_not_start():
    p = planner()
    running = [draft("a"), document("d1", left=50_000)]
    waiting = [WaitingRequest("next-draft", drafting=True, user="u2")]
    p._owed_s = 10.0  # documents have had nothing for a while
    plans = [p.plan(running, waiting, ["next-draft"], set()) for _ in range(2 * p.max_hold_steps)]
    assert plans[0].reason == "document_floor" and not plans[0].hold
    assert "drafting_waiting" in {plan.reason for plan in plans}  # the drafter's turn still comes
    assert p._held_for["next-draft"] <= p.max_hold_steps


def test_before_the_cost_model_is_fitted_documents_take_small_chunks_beside_drafting():
    p = Planner(config=PolicyConfig(), max_budget_tokens=2048)
    plan = p.plan([draft("a"), document("d1", left=5000)], [], [], set())
    assert plan.document_budget_tokens == p.unfitted_chunk_tokens
    alone = [p.plan([document("d1", left=5000)], [], [], set()) for _ in range(8)]
    assert {plan.reason for plan in alone} == {"calibrating"}  # until the fit can price a prompt token
    assert max(plan.token_budget for plan in alone) == p.unfitted_chunk_tokens


def test_document_chunks_go_to_users_in_turn_and_to_the_shortest_within_a_user():
    p = planner()
    running = [
        document("alice-long", left=4000, user="alice", arrival=1),
        document("alice-short", left=500, user="alice", arrival=2),
        document("bob", left=3000, user="bob", arrival=3),
        draft("drafter"),
    ]
    first = p.plan(running, [], [], set()).order
    second = p.plan(running, [], [], set()).order
    assert first[1:] == ("alice-short", "bob", "alice-long")
    assert second[1:] == ("bob", "alice-short", "alice-long")  # bob's turn first the next step


def test_a_drafter_vllm_does_not_start_holds_documents_only_a_few_steps():
    p = planner()
    running = [document("d1", left=3000)]
    waiting = [WaitingRequest("stuck-draft", drafting=True, user="u")]
    reasons = [p.plan(running, waiting, ["stuck-draft"], set()).reason for _ in range(p.max_hold_steps + 5)]
    assert reasons[: p.max_hold_steps] == ["drafting_waiting"] * p.max_hold_steps
    # Then steps of documents' floor (they were held for four steps), which do not count
    # against the drafter; then documents go on, in steps as short as a drafter's first.
    assert reasons[p.max_hold_steps] == "document_floor"
    assert reasons.count("drafting_waiting") == p.max_hold_steps
    assert reasons[-2:] == ["slow_start", "slow_start"]
    assert (
        len({plan.token_budget for plan in [p.plan(running, waiting, ["stuck-draft"], set()) for _ in range(3)]}) == 1
    )


def test_a_long_spell_of_drafting_alone_does_not_make_the_model_forget_what_prefill_costs():
    model = fitted_model()
    for _ in range(2000):  # minutes of decode-only steps
        shape = StepShape(decode_requests=8)
        model.observe(shape, FakeStepCosts.seconds(shape))
    base = StepShape(decode_requests=8)
    budget = model.prefill_budget(base, position=0, target_s=1.5 * FakeStepCosts.seconds(base))
    assert 160 <= budget <= 200


def test_with_no_prefill_step_seen_documents_take_small_chunks_beside_drafting():
    model = StepCostModel(window=64, refit_every=8, min_steps=16)
    for n in range(1, 40):
        shape = StepShape(decode_requests=n % 8 + 1)
        model.observe(shape, FakeStepCosts.seconds(shape))
    assert model.ready
    p = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=model)
    plan = p.plan([draft("a"), document("d1", left=5000)], [], [], set())
    assert plan.document_budget_tokens == p.unfitted_chunk_tokens  # not the whole step: the model cannot tell


class FakeOverrunningMachine:
    """A fake machine whose steps of decodes beside prefill take 20 % longer than its linear cost
    says (cache effects a linear fit does not see); decodes alone are as the fit says."""

    COEFFICIENTS = (0.030, 0.002, 0.0, 0.0005, 0.0, 0.0)

    @staticmethod
    def seconds(shape: StepShape) -> float:
        linear = 0.030 + 0.002 * shape.decode_requests + 0.0005 * shape.prefill_tokens
        return linear * (1.2 if shape.decode_requests and shape.prefill_tokens else 1.0)


def test_steps_beside_drafting_are_sized_by_what_such_steps_really_took():
    # Planned from the fit alone, documents beside drafters would make steps of ~1.4 x 1.2 = 1.7x
    # a drafting step. The model sees mixed steps overrun their prediction and the plan takes
    # that off the target, so that drafters' steps stay within the slowdown asked for.
    machine = FakeOverrunningMachine()
    model = StepCostModel(refit_every=10**9)  # the fit held still: only what it is told is observed
    model.coefficients = machine.COEFFICIENTS
    p = Planner(config=PolicyConfig(itl_slowdown=1.4), max_budget_tokens=2048, cost=model)
    base = StepShape(decode_requests=4, decode_context_tokens=400)
    alone = machine.seconds(base)
    blind = p.document_budget(base, position=0)
    assert machine.seconds(StepShape(decode_requests=4, prefill_tokens=blind)) > 1.6 * alone
    rng = random.Random(7)
    for _ in range(200):  # the engine runs: drafting steps, and documents beside them
        if rng.random() < 0.5:
            shape = StepShape(decode_requests=rng.randint(1, 8))
        else:
            shape = StepShape(decode_requests=rng.randint(1, 8), prefill_tokens=rng.choice([4, 40, 64, 256]))
        model.observe(shape, machine.seconds(shape) * rng.uniform(0.98, 1.02), beside_drafting=True)
    assert model.overrun() == pytest.approx(1.2, abs=0.03)
    tokens = p.document_budget(base, position=0)
    with_documents = machine.seconds(StepShape(decode_requests=4, decode_context_tokens=400, prefill_tokens=tokens))
    assert 1.3 * alone <= with_documents <= 1.45 * alone  # within the slowdown, and most of it used


def test_a_step_of_documents_floor_is_sized_by_what_steps_beside_drafting_really_took():
    # Documents owed their floor take 1.43x the drafters' step by the fit; on a machine whose
    # mixed steps run 1.2x over it, unsized that was 1.7x in drafters' ITL, in every floor step.
    machine = FakeOverrunningMachine()
    model = StepCostModel(refit_every=10**9)
    model.coefficients = machine.COEFFICIENTS
    p = Planner(config=PolicyConfig(itl_slowdown=1.4), max_budget_tokens=2048, cost=model)
    running = [draft(f"draft{i}", context=0) for i in range(4)] + [document("d1", left=50_000)]
    alone = machine.seconds(StepShape(decode_requests=4))

    def floor_step() -> float:
        p._owed_s = 10.0  # documents have had nothing for a while
        plan = p.plan(running, [], [], set())
        assert plan.reason == "document_floor"
        return machine.seconds(StepShape(decode_requests=4, prefill_tokens=plan.document_budget_tokens or 0))

    assert floor_step() > 1.65 * alone  # before the model has seen a mixed step run over
    rng = random.Random(3)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(1, 8), prefill_tokens=rng.choice([0, 4, 40, 64, 256]))
        model.observe(shape, machine.seconds(shape) * rng.uniform(0.98, 1.02), beside_drafting=True)
    assert model.overrun() == pytest.approx(1.2, abs=0.03)
    assert 1.35 * alone <= floor_step() <= 1.5 * alone  # documents still take more than the target leaves


def test_where_a_floor_step_cannot_pay_documents_back_drafters_still_start():
    # Steps beside drafting run 1.5x over the model (a machine busy with something else): a
    # floor step sized by that is little more than the ITL target and pays back little of what
    # documents are owed. A drafter waiting to start waits through two such steps at most.
    model = StepCostModel(refit_every=10**9)
    model.coefficients = FakeOverrunningMachine.COEFFICIENTS
    rng = random.Random(5)
    for _ in range(200):
        shape = StepShape(decode_requests=rng.randint(1, 8), prefill_tokens=rng.choice([0, 4, 40, 64, 256]))
        model.observe(shape, (model.predict(shape) or 0.0) * (1.5 if shape.prefill_tokens else 1.0),
                      beside_drafting=True)  # fmt: skip
    assert model.overrun() == 1.5

    def steps(p: Planner) -> list[str]:
        reasons = []
        for i in range(60):
            waiting = [WaitingRequest(f"new{i}", drafting=True, user="u2")]
            running = [draft("a"), draft("b"), document("d1", left=50_000)]
            reasons.append(p.plan(running, waiting, [f"new{i}"], set()).reason)
        return reasons

    unbounded = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=model, max_floor_steps_waited=10**6)
    unbounded._owed_s = 10.0  # documents have had nothing for a while
    assert "drafting_waiting" not in steps(unbounded)  # what it was: drafters never started
    p = Planner(config=PolicyConfig(), max_budget_tokens=2048, cost=model)
    p._owed_s = 10.0
    reasons = steps(p)
    assert "document_floor" in reasons
    assert "document_floor document_floor document_floor" not in " ".join(reasons)
    assert reasons.count("drafting_waiting") >= len(reasons) // 3


def test_overrun_is_one_until_enough_steps_were_seen_and_is_bounded():
    model = fitted_model()
    assert model.overrun() == pytest.approx(1.0, abs=0.05)  # a linear machine: nothing to correct
    fresh = StepCostModel(refit_every=10**9)  # the fit held still
    fresh.coefficients = (0.02, 0.002, 0.0, 0.0001, 0.0, 0.0)
    mixed = StepShape(decode_requests=2, prefill_tokens=100)  # predicted 34 ms
    for _ in range(40):
        fresh.observe(mixed, 1.0)  # a step the plan did not size beside drafting: not counted
    for _ in range(10):
        fresh.observe(mixed, 1.0, beside_drafting=True)  # 30x what it predicts
    assert fresh.overrun() == 1.0  # too few steps to tell
    for _ in range(10):
        fresh.observe(mixed, 1.0, beside_drafting=True)
    assert fresh.overrun() == 1.0  # no step of decodes alone to compare with yet
    assert fresh.overrun(relative=False) == 1.5
    for _ in range(20):
        fresh.observe(StepShape(decode_requests=2), 0.024)
    assert fresh.overrun() == 1.5  # bounded: a broken model does not stop documents


def test_steps_shorter_than_predicted_beside_drafting_give_documents_more():
    # The fit over every step over-predicts the small chunks beside drafters (here, they take
    # 80 % of their prediction): documents may take more before drafters' steps reach the target.
    model = StepCostModel(refit_every=10**9)
    model.coefficients = (0.030, 0.002, 0.0, 0.0005, 0.0, 0.0)
    p = Planner(config=PolicyConfig(itl_slowdown=1.4), max_budget_tokens=2048, cost=model)
    base = StepShape(decode_requests=4)
    before = p.document_budget(base, position=0)
    for _ in range(20):
        model.observe(StepShape(decode_requests=4), model.predict(StepShape(decode_requests=4)))
        shape = StepShape(decode_requests=4, prefill_tokens=before)
        model.observe(shape, 0.8 * model.predict(shape), beside_drafting=True)
    assert model.overrun() == pytest.approx(0.8)
    after = p.document_budget(base, position=0)
    assert after > before
    assert 0.8 * model.predict(StepShape(decode_requests=4, prefill_tokens=after)) <= 1.4 * 0.038 * 1.01


class FakePrefillKernelMachine:
    """A fake machine where any prefill in a step costs 15 ms on top of its tokens (another
    attention path), beside 30 ms a step, 2 ms a decoding request and 0.5 ms a prompt token."""

    @staticmethod
    def seconds(shape: StepShape) -> float:
        prefill = 0.015 + 0.0005 * shape.prefill_tokens if shape.prefill_tokens else 0.0
        return 0.030 + 0.002 * shape.decode_requests + prefill


def test_the_cost_model_learns_what_any_prefill_in_a_step_costs():
    machine = FakePrefillKernelMachine()
    rng = random.Random(11)
    model = StepCostModel(window=256, refit_every=8, min_steps=16)
    for _ in range(300):
        shape = StepShape(decode_requests=rng.randint(0, 8), prefill_tokens=rng.choice([0, 0, 8, 40, 256, 1024]))
        if shape.decode_requests or shape.prefill_tokens:
            model.observe(shape, machine.seconds(shape))
    assert model.prefill_step_s == pytest.approx(0.015, abs=0.002)
    # Beside 4 drafters (38 ms a step), a 1.4x target leaves 15 ms: all of it the prefill's own
    # cost, so documents get the least chunk, not the 30 tokens a model blind to it would give.
    base = StepShape(decode_requests=4)
    p = Planner(config=PolicyConfig(itl_slowdown=1.4), max_budget_tokens=2048, cost=model)
    tokens = p.document_budget(base, position=0)
    assert tokens == p.min_chunk_tokens
    assert machine.seconds(StepShape(decode_requests=4, prefill_tokens=max(tokens, 1))) <= 1.45 * machine.seconds(base)
    roomy = Planner(config=PolicyConfig(itl_slowdown=2.0), max_budget_tokens=2048, cost=model)
    tokens = roomy.document_budget(base, position=0)  # 38 ms left: 15 for the prefill, 46 tokens
    assert 40 <= tokens <= 50
    # A snapshot from before this feature still loads.
    assert StepCostModel.from_coefficients((0.03, 0.002, 0.0, 0.0005, 0.0)).prefill_step_s == 0.0


def pooling_planner(machine, **config) -> Planner:
    model = StepCostModel(refit_every=10**9)  # the fit held still at the fake machine's costs
    model.coefficients = machine.COEFFICIENTS
    return Planner(config=PolicyConfig(**config), max_budget_tokens=2048, cost=model,
                   default_draft_prompt_tokens=40)  # fmt: skip


class FakeSlowPrefillCpu:
    """A fake CPU where prompt tokens are dear beside decoding: 40 ms a step, 2 ms a decoding
    request, 3 ms a prompt token, and 10 ms for holding any prefill in a step."""

    COEFFICIENTS = (0.040, 0.002, 0.0, 0.003, 0.0, 0.010)

    @staticmethod
    def seconds(shape: StepShape) -> float:
        prefill = 0.010 + 0.003 * shape.prefill_tokens if shape.prefill_tokens else 0.0
        return 0.040 + 0.002 * shape.decode_requests + prefill


def felt_alone(p: Planner, machine, drafters: int = 3, *, starting_every: int = 10) -> Planner:
    """``p`` having measured 200 steps of ``drafters`` drafting alone on ``machine``, one in
    ``starting_every`` reading a new drafter's 40-token prompt (an office where drafters start
    often: their p95 alone is such a step)."""
    for i in range(200):
        prompt = 40 if i % starting_every == 0 else 0
        p.note_step(machine.seconds(StepShape(decode_requests=drafters, prefill_tokens=prompt)), drafting_only=True)
    return p


def run_beside_drafters(p: Planner, machine, steps: int = 400) -> tuple[list[float], int]:
    """Steps of 3 drafters decoding beside one long document: each step's duration, and the
    document's prompt tokens read."""
    done, durations = 0, []
    for _ in range(steps):
        running = [draft(f"draft{i}", context=60) for i in range(3)] + [document("doc", left=20000, done=done)]
        plan = p.plan(running, [], [], set(), now=0.0)
        tokens = plan.token_budget - 3
        durations.append(machine.seconds(StepShape(decode_requests=3, prefill_tokens=tokens)))
        done += tokens
    return durations, done


def test_where_a_chunk_has_a_large_fixed_cost_documents_save_up_beside_drafting():
    # Beside 3 drafters (46 ms a step) a 1.4x target leaves 18 ms: the floor of 4 tokens a step
    # would cost 22 ms every step (10 of them fixed), making drafters' steps 1.48x. Saved up (the
    # default), drafters' mean step is no longer, documents read more tokens in it (1.4x here:
    # the fixed cost paid once a chunk), and no step is longer than one that reads a drafter's
    # prompt, which drafters wait for alone too.
    machine = FakeSlowPrefillCpu()
    alone = machine.seconds(StepShape(decode_requests=3))
    first_step = machine.seconds(StepShape(decode_requests=3, prefill_tokens=40))
    per_step, per_step_tokens = run_beside_drafters(pooling_planner(machine, chunk_fixed_cost_share=0), machine)
    assert sum(per_step) / len(per_step) > 1.45 * alone  # the floor's fixed cost, paid every step
    # Until it knows what drafters feel alone, the planner saves nothing up.
    assert run_beside_drafters(pooling_planner(machine, chunk_fixed_cost_share=0.5), machine) == (
        per_step, per_step_tokens,
    )  # fmt: skip
    saved, saved_tokens = run_beside_drafters(felt_alone(pooling_planner(machine, chunk_fixed_cost_share=0.5), machine),
                                              machine)  # fmt: skip
    assert sum(saved) / len(saved) <= sum(per_step) / len(per_step) * 1.02
    assert max(saved) <= first_step * 1.02
    assert saved_tokens >= 1.3 * per_step_tokens
    assert sum(d == alone for d in saved) > len(saved) / 2  # most steps: drafting alone


def test_a_saved_up_chunks_step_is_no_longer_than_what_drafters_feel_alone_at_p95():
    # Drafters who seldom start: alone, their steps are decode steps (46 ms) at p95, and a chunk
    # step as long as one reading a drafter's prompt (176 ms) would be their ITL p95 beside
    # documents. Measured steps of drafting alone bound it to 1.4x their p95 instead, or to one
    # chunk of the 4 tokens documents always read where that is longer (documents' floor, a rule
    # of its own, is left out here).
    machine = FakeSlowPrefillCpu()
    alone = machine.seconds(StepShape(decode_requests=3))
    one_chunk = machine.seconds(StepShape(decode_requests=3, prefill_tokens=4))
    p = pooling_planner(machine, chunk_fixed_cost_share=0.5, document_min_share=0)
    assert p.drafting_step_p95_s() is None  # nothing measured yet
    for _ in range(p.min_drafting_steps):
        p.note_step(alone, drafting_only=True)
        p.note_step(5.0, drafting_only=False)  # a step with documents in it is not what drafters feel alone
    assert p.drafting_step_p95_s() == pytest.approx(alone)
    bounded, bounded_tokens = run_beside_drafters(p, machine)
    assert max(bounded) <= max(1.4 * alone, one_chunk) * 1.02
    assert max(
        run_beside_drafters(
            felt_alone(pooling_planner(machine, chunk_fixed_cost_share=0.5, document_min_share=0), machine), machine
        )[0]
    ) > (2 * alone)
    _, per_step_tokens = run_beside_drafters(
        pooling_planner(machine, chunk_fixed_cost_share=0, document_min_share=0), machine
    )
    assert bounded_tokens >= per_step_tokens  # documents still read what a chunk every step gave them
    # Where drafters often start, their p95 alone is a step reading a prompt: a chunk's step may
    # be as long as that one.
    often = felt_alone(pooling_planner(machine, chunk_fixed_cost_share=0.5), machine)
    first_step = machine.seconds(StepShape(decode_requests=3, prefill_tokens=40))
    assert often.pooled_step_s(StepShape(decode_requests=3), 1.4 * alone) == pytest.approx(first_step)


class FakeAttentionCpu:
    """A fake CPU whose prompt tokens are dear deep into a document: 40 ms a step, 2 ms a
    decoding request, 3 ms a prompt token and 2 ms more for every 1,000 tokens before it, 10 ms
    for holding any prefill in a step; the cost model fitted to it cannot see that last cost
    (``COEFFICIENTS``: a fixed cost of 0, as a fit on a real CPU gave in one repeat)."""

    COEFFICIENTS = (0.040, 0.002, 0.0, 0.003, 2.0, 0.0)

    @staticmethod
    def seconds(shape: StepShape) -> float:
        prefill = (
            0.010 + 0.003 * shape.prefill_tokens + 2.0 * shape.prefill_attention / 1e6 if shape.prefill_tokens else 0
        )
        return 0.040 + 0.002 * shape.decode_requests + prefill


def test_where_the_smallest_chunk_does_not_fit_beside_drafting_documents_save_up_whatever_the_fit_says():
    # 1,500 tokens into a document, 4 prompt tokens cost 24 ms by the model, more than the 18 ms
    # a 1.4x target leaves beside 3 drafters: a chunk every step would make every step overrun,
    # and pay the fixed cost the model cannot see each time. Saved up, drafters' mean step is
    # shorter and documents read more a second.
    machine = FakeAttentionCpu()

    def run(p: Planner) -> tuple[list[float], int]:
        durations, read = [], 0
        for _ in range(400):
            running = [draft(f"draft{i}", context=60) for i in range(3)] + [document("doc", left=20000, done=1500)]
            tokens = p.plan(running, [], [], set(), now=0.0).token_budget - 3
            durations.append(machine.seconds(StepShape(3, 180, tokens, tokens * (1500 + tokens / 2))))
            read += tokens
        return durations, read

    per_step, per_step_tokens = run(pooling_planner(machine, chunk_fixed_cost_share=0, document_min_share=0))
    saved, saved_tokens = run(felt_alone(pooling_planner(machine, chunk_fixed_cost_share=0.5, document_min_share=0),
                                         machine))  # fmt: skip
    alone = machine.seconds(StepShape(decode_requests=3, decode_context_tokens=180))
    assert min(per_step) > 1.4 * alone  # every step overran the target
    assert sum(d == alone for d in saved) > len(saved) / 2  # saved up: most steps are drafting alone
    assert sum(saved) / len(saved) <= sum(per_step) / len(per_step) * 1.02
    # A chunk's step is no longer than one reading a drafter's prompt (the 4 tokens owed a
    # saving step are spent before they would make it longer).
    assert max(saved) <= machine.seconds(StepShape(decode_requests=3, prefill_tokens=40)) * 1.02
    # Documents read as many tokens a step (4 on average, the least they always get) in steps
    # that take less time: the unseen fixed cost is paid once a chunk (1.11x the tokens a second).
    assert saved_tokens / sum(saved) >= 1.05 * per_step_tokens / sum(per_step)
    # Early in a document 4 tokens cost 12 ms, within the 18 ms: a chunk every step, as before.
    p = felt_alone(pooling_planner(machine, chunk_fixed_cost_share=0.5, document_min_share=0), machine)
    base = StepShape(decode_requests=3, decode_context_tokens=180)
    assert all(p.pooled_document_budget(base, 0) == p.document_budget(base, 0) > 0 for _ in range(20))


def test_where_a_chunk_is_cheap_documents_take_their_share_every_step():
    # A GPU-like machine: a chunk's fixed cost is small beside a step's spare time; nothing is saved up.
    class GpuLike:
        COEFFICIENTS = (0.020, 0.0005, 0.0, 0.00002, 0.0, 0.0005)

        @staticmethod
        def seconds(shape: StepShape) -> float:
            prefill = 0.0005 + 0.00002 * shape.prefill_tokens if shape.prefill_tokens else 0.0
            return 0.020 + 0.0005 * shape.decode_requests + prefill

    durations, tokens = run_beside_drafters(pooling_planner(GpuLike(), chunk_fixed_cost_share=0.1), GpuLike(), steps=50)
    assert len(set(durations)) == 1 and tokens >= 50 * 300  # the same chunk every step


def test_a_chunks_fixed_cost_is_not_counted_as_documents_progress():
    # Beside 16 drafters on the fake CPU (72 ms a step) an ITL target of 80 ms leaves room for
    # the floor of 4 tokens only: 22 ms, 10 of them the fixed cost of holding a chunk. By the
    # share of the step they take, documents would look fed (22 / 94 ms); by what they read
    # (12 ms) they crawl, and their floor steps read a fifth of the time.
    machine = FakeSlowPrefillCpu()
    running = [draft(f"draft{i}", context=60) for i in range(16)] + [document("doc", left=50_000)]

    def reading_share(p: Planner) -> float:
        steps = [p.plan(running, [], [], set(), now=0.0) for _ in range(300)]
        tokens = [plan.document_budget_tokens or 0 for plan in steps]
        durations = [machine.seconds(StepShape(decode_requests=16, prefill_tokens=n)) for n in tokens]
        return sum(0.003 * n for n in tokens) / sum(durations)

    def planner_on(**config) -> Planner:
        return Planner(config=PolicyConfig(itl_target_ms=80, **config), max_budget_tokens=2048,
                       cost=StepCostModel.from_coefficients(FakeSlowPrefillCpu.COEFFICIENTS))  # fmt: skip

    assert reading_share(planner_on(document_min_share=0, chunk_fixed_cost_share=0)) < 0.15
    assert 0.18 <= reading_share(planner_on(chunk_fixed_cost_share=0)) <= 0.3
    # Saved up, the fixed cost is paid once a chunk: documents read more of the
    # same steps' time, floor or not.
    saved_up = felt_alone(planner_on(document_min_share=0, chunk_fixed_cost_share=0.5), machine, 16)
    assert reading_share(saved_up) > reading_share(planner_on(document_min_share=0, chunk_fixed_cost_share=0))
