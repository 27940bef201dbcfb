"""The appliance's scheduler inside vLLM's engine core (``SchedulerConfig.scheduler_cls``).

It subclasses vLLM's own scheduler and, before each step, applies the plan of
``step_policy.Planner`` to vLLM's state, then lets vLLM build the batch as it always does:

- a running document held back this step (its prefill, or its decode beside drafting) gets ``next_decode_eligible_step``
  past the step (the per-request skip vLLM's own schedulers use, e.g. for diffusion reads):
  it keeps its KV blocks and is not preempted;
- running requests are visited drafting first, then documents decoding, then documents in
  mid-prefill in the plan's fair order;
- the step's token budget (``max_num_scheduled_tokens``) is the plan's for that step;
- waiting requests the KV admission defers are taken out of the waiting queue for the step.

Everything is restored after the step, so vLLM's invariants hold between steps. After each step
the measured duration feeds the step-cost model. The engine host talks to the scheduler through
an engine-core utility method, ``appliance_scheduler`` (``snapshot`` / ``configure``), answered
between steps on the engine core's own thread. This module runs in the engine core process:
it imports vLLM and the pure ``step_policy``, never Django.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from inference.engine.step_policy import (
    SIZED_BESIDE_DRAFTING,
    KvState,
    Mode,
    OutputLengths,
    Planner,
    PolicyConfig,
    RunningRequest,
    StepPlan,
    StepShape,
    WaitingRequest,
    admit,
    blocks_for,
    quantile,
)

# Under "vllm." so that it logs with the engine core's own lines.
logger = logging.getLogger("vllm.appliance.scheduler")

# The policy the engine host starts the engine core with (JSON of ``PolicyConfig``): the engine
# core is a spawned process, so it comes through the environment.
CONFIG_ENV = "APPLIANCE_SCHEDULER_CONFIG"
STEP_TIMES_KEPT = 2048  # steps of each plan's reason whose times the snapshot reads
UTILITY_METHOD = "appliance_scheduler"

_FINISHED_NATURALLY = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def appliance_args(request: Request) -> dict:
    """What the engine host put in the request's ``extra_args["appliance"]`` (user, ...)."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    return (extra or {}).get("appliance") or {}


def _host_id(request: Request) -> str:
    return str(appliance_args(request).get("id", request.request_id))


if TYPE_CHECKING:  # the mixin reads and overrides vLLM's scheduler, which it is mixed into
    _SchedulerBase = Scheduler
else:
    _SchedulerBase = object


class ApplianceScheduling(_SchedulerBase):
    """The mixin; ``ApplianceScheduler`` and ``ApplianceAsyncScheduler`` below are the classes
    vLLM is given (the async one when vLLM schedules asynchronously, as it does on a GPU)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = PolicyConfig.from_dict(json.loads(os.environ.get(CONFIG_ENV) or "{}"))
        self.planner = Planner(config=config, max_budget_tokens=self.max_num_scheduled_tokens)
        self.output_lengths = OutputLengths()
        self._reserve_tokens: dict[str, int] = {}  # running request -> its reservation (prompt + output)
        # step -> (when, shape, the plan's reason: a mode's name outside the appliance's mode,
        # whether it held drafting requests alone, documents' prompt tokens in it)
        self._pending: dict[int, tuple[float, StepShape, str, bool, int]] = {}
        # The last steps' measured times and their ratio to the cost model's prediction, by the
        # plan's reason: which steps drafters wait for (``appliance_snapshot``, ``bench scheduling``).
        self._step_times: dict[str, deque[tuple[float, float | None]]] = {}
        # And all of them since the policy was last configured, by the plan's reason: steps, their
        # seconds, documents' prompt tokens read in them (where documents' progress comes from).
        self._step_totals: defaultdict[tuple[str, str], float] = defaultdict(float)  # (reason, what) -> sum
        self._last_update_at = 0.0
        self._default_threshold = self.scheduler_config.long_prefill_token_threshold
        self._counters: Counter[str] = Counter()
        self._last_plan = StepPlan()
        self._waiting_why: dict[str, str] = {}
        self._kv: KvState | None = None
        logger.info("appliance scheduler: %s", config.to_dict())

    # --- vLLM's hooks ---------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False):
        if self.planner.config.mode is Mode.APPLIANCE:
            output = self._schedule_with_plan(throttle_prefills)
        else:
            output = self._schedule_as_vllm(throttle_prefills)
        if output.total_num_scheduled_tokens:
            config = self.planner.config
            reason = self._last_plan.reason if config.mode is Mode.APPLIANCE else config.mode.value
            shape, drafting_only, documents = self._step_of(output)
            # Under vLLM's own modes every request may have drafting's priority: only the
            # appliance's steps tell what drafters feel alone.
            drafting_only = drafting_only and config.mode is Mode.APPLIANCE
            self._pending[id(output)] = (time.monotonic(), shape, reason, drafting_only, documents)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        now = time.monotonic()
        pending = self._pending.pop(id(scheduler_output), None)
        if pending is not None:
            scheduled_at, shape, reason, drafting_only, documents = pending
            # Steps may overlap (async scheduling): a step's own time starts when the one
            # before it ended, or when it was scheduled if the engine was idle.
            seconds = now - max(scheduled_at, self._last_update_at)
            predicted = self.planner.cost.predict(shape)
            self._step_times.setdefault(reason, deque(maxlen=STEP_TIMES_KEPT)).append(
                (seconds, seconds / predicted if predicted else None)
            )
            for what, value in (("total_steps", 1), ("total_s", seconds), ("document_tokens", documents)):
                self._step_totals[reason, what] += value
            self.planner.cost.observe(shape, seconds, beside_drafting=reason in SIZED_BESIDE_DRAFTING)
            self.planner.note_step(seconds, drafting_only=drafting_only)
            self._last_update_at = now
        return super().update_from_output(scheduler_output, model_runner_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        if request.status in _FINISHED_NATURALLY:
            self.output_lengths.record(drafting=self._drafting(request), output_tokens=request.num_output_tokens)
        self._reserve_tokens.pop(request.request_id, None)
        return super()._free_request(request, delay_free_blocks)

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        self._counters["preemptions"] += 1
        self._reserve_tokens.pop(request.request_id, None)  # taken again when it starts again
        super()._preempt_request(request, timestamp, drop_stale_output)

    # --- the two ways of scheduling -----------------------------------------------------------

    def _schedule_as_vllm(self, throttle_prefills: bool):
        threshold = self.planner.config.long_prefill_token_threshold
        if not threshold:
            return super().schedule(throttle_prefills)
        self.scheduler_config.long_prefill_token_threshold = threshold
        try:
            return super().schedule(throttle_prefills)
        finally:
            self.scheduler_config.long_prefill_token_threshold = self._default_threshold

    def _schedule_with_plan(self, throttle_prefills: bool):
        self._reserve_tokens = {rid: n for rid, n in self._reserve_tokens.items() if rid in self.requests}
        running = [self._running_view(r) for r in self.running]
        waiting = list(self.waiting)  # in the order vLLM visits them: drafting first, then by arrival
        views = [self._waiting_view(r) for r in waiting]
        admitted, deferred, why = self._admission(waiting, views)
        plan = self.planner.plan(running, views, admitted, deferred)
        self._last_plan, self._waiting_why = plan, why
        self._counters[f"steps_{plan.reason}"] += 1
        if plan.hold:
            self._counters["held_document_steps"] += len(plan.hold)

        held: list[tuple[Request, int]] = []
        for request in self.running:
            if request.request_id in plan.hold:
                held.append((request, request.next_decode_eligible_step))
                # schedule() advances current_step first: +2 skips this step alone.
                request.next_decode_eligible_step = max(request.next_decode_eligible_step, self.current_step + 2)
        if plan.order:
            rank = {rid: i for i, rid in enumerate(plan.order)}
            self.running[:] = sorted(self.running, key=lambda r: rank.get(r.request_id, len(rank)))
        hidden = [r for r in waiting if r.request_id in plan.defer]
        if hidden:
            self.waiting.remove_requests(hidden)
        budget = self.max_num_scheduled_tokens
        if plan.token_budget is not None:
            self.max_num_scheduled_tokens = min(budget, plan.token_budget)
        try:
            output = super().schedule(throttle_prefills)
        finally:
            self.max_num_scheduled_tokens = budget
            for request in hidden:
                self.waiting.add_request(request)
            for request, eligible in held:
                request.next_decode_eligible_step = eligible
        for request in self.running:  # a request that just started takes its reservation now
            if request.request_id not in self._reserve_tokens:
                self._reserve_tokens[request.request_id] = self._reservation(request)
        return output

    # --- views of vLLM's state ----------------------------------------------------------------

    def _drafting(self, request: Request) -> bool:
        return request.priority <= self.planner.config.drafting_priority

    def _reservation(self, request: Request) -> int:
        """Tokens the request may come to hold: all it has, plus the output it may still write."""
        left = max(0, request.max_tokens - request.num_output_tokens)
        output = self.output_lengths.reserve_output(
            drafting=self._drafting(request), max_tokens=request.max_tokens, reservation=self.planner.config.reservation
        )
        return request.num_tokens + min(left, max(0, output - request.num_output_tokens))

    def _held_blocks(self, request_id: str) -> int:
        return len(self.kv_cache_manager.coordinator.get_blocks(request_id)[0])

    def _running_view(self, request: Request) -> RunningRequest:
        need = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        return RunningRequest(
            request_id=request.request_id,
            drafting=self._drafting(request),
            user=str(appliance_args(request).get("user", "")),
            arrival=request.arrival_time,
            need_tokens=max(0, need),
            prefill_left=max(0, request.num_tokens - request.num_computed_tokens) if need > 1 else 0,
            context_tokens=request.num_computed_tokens,
        )

    def _waiting_view(self, request: Request) -> WaitingRequest:
        return WaitingRequest(
            request_id=request.request_id,
            drafting=self._drafting(request),
            user=str(appliance_args(request).get("user", "")),
            ready=not self._is_blocked_waiting_status(request.status),
        )

    def _reserve_blocks(self, request: Request) -> int:
        """Blocks the request's reservation needs: a prefix it shares with a running request
        (blocks in use, found in the prefix cache) is counted once, there."""
        blocks, _, _ = self.kv_cache_manager.get_computed_blocks(request)
        shared = sum(1 for block in (blocks.blocks[0] if blocks.blocks else ()) if block.ref_cnt > 0)
        return max(0, blocks_for(self._reservation(request), self.block_size) - shared)

    def _admission(
        self, waiting: list[Request], views: list[WaitingRequest]
    ) -> tuple[list[str], set[str], dict[str, str]]:
        future = 0
        for request in self.running:
            reserve = self._reserve_tokens.get(request.request_id)
            if reserve is None:
                reserve = self._reserve_tokens[request.request_id] = self._reservation(request)
            future += max(0, blocks_for(reserve, self.block_size) - self._held_blocks(request.request_id))
        pool = self.kv_cache_manager.block_pool
        self._kv = kv = KvState(
            total_blocks=pool.num_gpu_blocks - 1,  # one is vLLM's null block
            free_blocks=pool.get_num_free_blocks(),
            running_future_blocks=future,
            free_slots=self.max_num_active_reqs - len(self.running),
        )
        by_id = {request.request_id: request for request in waiting}
        return admit(
            views, kv, self.planner.config, reserve_blocks=lambda view: self._reserve_blocks(by_id[view.request_id])
        )

    def _step_of(self, output) -> tuple[StepShape, bool, int]:
        """In one pass over a scheduled step: what it computes (its shape), whether it holds
        drafting requests alone, and the documents' prompt tokens in it (a recomputed prompt,
        after a preemption, counts again)."""
        decodes: list[int] = []
        chunks: list[tuple[int, int]] = []
        drafting_only, documents = True, 0
        for request_id, tokens in output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None:
                drafting_only = False
                continue
            start = request.num_computed_tokens - tokens  # already advanced by this step
            if tokens > 1 or start < request.num_prompt_tokens:
                chunks.append((start, tokens))
            else:
                decodes.append(start)
            if not self._drafting(request):
                drafting_only = False
                documents += max(0, min(tokens, request.num_prompt_tokens - start))
        return StepShape.of(decodes, chunks), drafting_only, documents

    # --- talking to the engine host -----------------------------------------------------------

    def appliance_configure(self, values: dict) -> None:
        config = self.planner.config.updated(values)
        if config.mode is not self.planner.config.mode:
            self.planner.forget_drafting_steps()  # what drafters felt under another mode
        self.planner.config = config
        self._step_times.clear()  # they describe the policy in force
        self._step_totals.clear()
        logger.info("appliance scheduler: %s", config.to_dict())

    def _step_times_snapshot(self) -> dict[str, dict[str, float | int | None]]:
        """By the plan's reason, over its last ``STEP_TIMES_KEPT`` steps since the policy was last
        configured: how many, their measured time (median, p95) and its ratio to the cost
        model's prediction (p95); and over all of them since then, how many (``total_steps``),
        their time (``total_s``) and the documents' prompt tokens they read
        (``document_tokens``)."""
        out: dict[str, dict[str, float | int | None]] = {}
        for reason, times in sorted(self._step_times.items()):
            seconds = [t for t, _ in times]
            ratios = [r for _, r in times if r is not None]
            out[reason] = {
                "steps": len(seconds),
                "p50_ms": round(quantile(seconds, 0.5) * 1000, 2),
                "p95_ms": round(quantile(seconds, 0.95) * 1000, 2),
                "p95_over_model": round(quantile(ratios, 0.95), 3) if ratios else None,
                "total_steps": int(self._step_totals[reason, "total_steps"]),
                "total_s": round(self._step_totals[reason, "total_s"], 3),
                "document_tokens": int(self._step_totals[reason, "document_tokens"]),
            }
        return out

    def appliance_snapshot(self) -> dict:
        planner, plan = self.planner, self._last_plan
        kv = self._kv
        base = StepShape.of(
            [r.num_computed_tokens for r in self.running if not r.is_prefill_chunk and self._drafting(r)], []
        )
        target = planner.target_step_s(base)
        return {
            "config": planner.config.to_dict(),
            "step": self.current_step,
            "plan": {
                "reason": plan.reason,
                "held": len(plan.hold),
                "deferred": len(plan.defer),
                "document_budget_tokens": plan.document_budget_tokens,
            },
            "target_step_ms": round(target * 1000, 3) if target else None,
            # The engine's time spent on documents' prompts and decodes lately (None: none prefilling).
            "document_share": None if (share := planner.document_share()) is None else round(share, 4),
            "draft_prompt_tokens": planner.draft_prompt_tokens(),  # a drafter's first step, as the plan assumes
            # What drafters lately felt at p95 in steps of drafting alone (bounds a saved-up chunk's step).
            "drafting_step_p95_ms": None if (p95 := planner.drafting_step_p95_s()) is None else round(p95 * 1000, 2),
            "cost_model": planner.cost.snapshot(),
            "counters": dict(self._counters),
            "step_times": self._step_times_snapshot(),
            "kv": {
                "block_size": self.block_size,
                "total_blocks": kv.total_blocks if kv else self.kv_cache_manager.block_pool.num_gpu_blocks - 1,
                "free_blocks": self.kv_cache_manager.block_pool.get_num_free_blocks(),
                "reserved_future_blocks": kv.running_future_blocks if kv else 0,
                "reserved_tokens": sum(self._reserve_tokens.values()),
            },
            "predicted_output_tokens": {
                "drafting": self.output_lengths.predicted(drafting=True),
                "document": self.output_lengths.predicted(drafting=False),
            },
            # By the engine host's request ids (vLLM adds a suffix of its own to each):
            # waiting requests in the order they will start, with why each still waits,
            "waiting": [[_host_id(r), self._waiting_why.get(r.request_id, "queued")] for r in self.waiting],
            # requests still reading their prompt (tokens computed, prompt tokens),
            "prefill": {
                _host_id(r): [r.num_computed_tokens, r.num_prompt_tokens]
                for r in self.running
                if r.num_computed_tokens < r.num_prompt_tokens
            },
            # and each running request's reservation (tokens).
            "reservations": {
                _host_id(self.requests[rid]): tokens
                for rid, tokens in self._reserve_tokens.items()
                if rid in self.requests
            },
        }


class ApplianceScheduler(ApplianceScheduling, Scheduler):
    pass


class ApplianceAsyncScheduler(ApplianceScheduling, AsyncScheduler):
    pass


def scheduler_class_path(*, async_scheduling: bool) -> str:
    name = ApplianceAsyncScheduler.__name__ if async_scheduling else ApplianceScheduler.__name__
    return f"{__name__}.{name}"


def _appliance_scheduler_utility(self, command: str, payload: str = "{}") -> str:
    """An engine-core utility method (``AsyncLLM.engine_core.call_utility_async``): answered
    between steps, on the engine core's thread, so it reads and changes the scheduler safely."""
    scheduler = self.scheduler
    if not isinstance(scheduler, ApplianceScheduling):
        raise RuntimeError("the engine core does not run the appliance's scheduler")
    if command == "configure":
        scheduler.appliance_configure(json.loads(payload))
    elif command == "forget_output_lengths":
        scheduler.output_lengths.forget()
    elif command != "snapshot":
        raise ValueError(f"unknown scheduler command {command!r}")
    return json.dumps(scheduler.appliance_snapshot())


def _install_utility() -> None:
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, UTILITY_METHOD):
        setattr(EngineCore, UTILITY_METHOD, _appliance_scheduler_utility)


_install_utility()
