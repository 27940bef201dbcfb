"""What one engine step should hold: drafting first, documents in what is left. Pure: no vLLM.

vLLM's scheduler builds a batch at every step of the engine: running requests first (each takes
what it needs, a long prompt a chunk of the step's token budget), then waiting ones. Left
alone it lets documents in mid-prefill eat each step's budget, so a drafting request that
arrives behind them waits for their prefill, and every drafter's next token waits for the
document chunk in its step. The appliance's scheduler (``vllm_scheduler.py``) asks this module,
before each step, for a ``StepPlan`` and applies it to vLLM's own scheduling:

- **Drafting first.** While an admissible drafting request waits to start, document prefill
  chunks are held back for that step (not preempted: they keep their KV and resume the next
  step), so the drafter is admitted and prefilled at once.
- **Documents in what is left.** While drafting requests are running, each step holds their
  decode tokens and, besides, documents' work up to what the step-cost model (``StepCostModel``)
  says keeps the step within the drafting ITL target: first the decodes of documents that are
  writing their answers (as many as fit, those held longest first, at least one: the others are
  held for the step and keep their KV), then prefill chunks in what is left. The target is the
  time a step of the drafting work alone takes (a document's decode is not drafting: with its
  long context it costs a step about what two drafters' do on one CPU's fitted costs, and
  counted as part of the drafting step the target multiplied it too), times
  ``itl_slowdown`` (or an absolute ``itl_target_ms``), divided by
  how far such steps have lately run over the model's prediction (``StepCostModel.overrun``: a
  least-squares fit is right on average, drafters feel the long steps). Where a chunk's own
  fixed cost is more than ``chunk_fixed_cost_share`` (0.5) of a step's spare time, or where a
  chunk of ``min_chunk_tokens`` does not fit in it (a CPU), documents save the spare time up (at
  least what a chunk of ``min_chunk_tokens`` would cost a step) and spend it in one chunk, in a
  step no longer than a drafter's first step nor ``itl_slowdown`` times what drafters felt at
  p95 in steps of drafting alone (``pooled_document_budget``, ``pooled_step_s``).
  Never less than ``min_chunk_tokens`` (4) a step on average: documents always progress.
- **A floor for documents.** When drafting fills the engine (more drafters than the ITL target
  leaves room beside, a stream of them starting), documents would get those 4 tokens a step
  and little else. The planner keeps an account of the engine time documents are owed:
  ``document_min_share`` (0.2) of each step in which they wait for prefill, less the time their
  prompt tokens and their decodes took in it (by the cost model; a step's fixed cost of holding
  a chunk is not progress). Once they are owed four steps' worth, documents' work takes 1.5 x
  that share of a step (``document_floor``), and a drafter waiting to start starts after at
  most two such steps. Documents keep about a fifth of their speed alone; drafters pay for it
  in ITL under such load, no more than in the other steps beside them: a floor step is sized
  by how far such steps lately overran the cost model, as those are.
- **Work-conserving.** With no drafting request in the engine, documents run at full speed,
  several batched together: in steps of the whole budget on a GPU, where a step's fixed cost
  is large, and of the smallest chunk that keeps them within ``idle_throughput_loss`` (2 %) of
  that speed where it is small (a CPU), so that a drafter who arrives waits for a short step.
  While drafting comes and goes (a drafter seen in the last ``drafting_recent_s``), such a step
  is also no longer than the gap step (``Planner.gap_step_s``: what keeps a drafter who arrives
  as it begins within ``ttft_slowdown``, 2x, of a drafter's TTFT alone; about 140 ms on a 2-core
  CPU), or a drafter's own first step (its prompt, as recent drafters' were) when that is
  longer. (A fixed 250 ms, the rule until 2026-12-06, put drafting's TTFT p95 at 2.3x alone
  under steady arrivals: the slowest 5 % were those that arrived as a gap step began. Held to a drafter's
  first step alone, some 60 ms on this CPU, documents ran at half speed in those gaps: the burst
  benchmark's documents lost a third of their speed to it. Without such a bound, documents
  quickly ramping back to the 2 % rule's step, 0.7 s here, the first drafter of each burst
  waited for it: TTFT p95 x3.4.) When that window runs out, steps ramp from the gap's step to
  the 2 % rule's (``idle_ramp_factor`` a step) instead of jumping to it.
  A fresh engine core, whose cost model cannot price a prompt token yet, first reads documents in
  small steps of two sizes (``calibrating``) until it can.
  A backlog that arrives at an empty engine, or that the last drafter leaves, starts with a step
  no longer than a drafter's first step, and each documents-only step after it may be
  ``idle_ramp_factor`` (2) times the one before, up to the step the rules above allow: a drafter
  who arrives t seconds after the engine got busy waits for a step no longer than about t (a
  slow start), and the backlog loses a few steps' fixed cost.
- **Fair between users.** Document chunks go to users in turn (the user served longest ago
  first), and to the document with the least prefill left within a user.
- **KV admission by blocks** (``admit``): a waiting request enters the engine only while its
  reservation fits beside the reservations of the running requests: ``prompt + max output``
  tokens (``Reservation.MAX``, never a preemption) or ``prompt + predicted output``
  (``Reservation.PREDICTED``, vLLM's preemption as the safety net), in KV blocks, counting the
  blocks of a prefix it shares with a running request once. The reservation is taken when the
  request enters the engine, not while it waits. Documents may not use the last
  ``decode_reserve_fraction`` of the blocks, so that a drafter can always start.

``Mode.ENGINE`` and ``Mode.FIFO`` leave vLLM's scheduling alone (they are the baselines of
``bench scheduling``); ``ENGINE`` may set vLLM's ``long_prefill_token_threshold`` per step, so
that the baseline can be tuned without restarting the engine.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any


class Mode(StrEnum):
    APPLIANCE = "appliance"  # this module's plan, KV admission by blocks
    ENGINE = "engine"  # vLLM's priority scheduling alone (drafting at a higher priority)
    FIFO = "fifo"  # vLLM alone, every request at the same priority


class Reservation(StrEnum):
    MAX = "max"  # prompt + max output tokens: never preempted
    PREDICTED = "predicted"  # prompt + predicted output; vLLM preempts if a request outgrows it


@dataclass(frozen=True)
class PolicyConfig:
    """How the appliance's scheduler behaves; the engine host sends it, and can change it on a
    running engine (``manage.py bench scheduling`` compares modes in one run)."""

    mode: Mode = Mode.APPLIANCE
    reservation: Reservation = Reservation.MAX
    # A step holding documents' work (decodes, prefill chunks) beside drafting may take this many
    # times as long as the same step of drafting alone (or ``itl_target_ms`` when that is set).
    itl_slowdown: float = 1.4
    itl_target_ms: float = 0.0
    kv_safety_factor: float = 0.95  # share of the KV blocks reservations may fill
    kv_decode_reserve_fraction: float = 0.1  # of those, kept for drafting
    # With nobody drafting, documents may lose this share of their speed to shorter steps (so
    # that a drafter who arrives waits less); 0: always vLLM's whole budget.
    idle_throughput_loss: float = 0.02
    # For this long after a drafter was last in the engine, a step with nobody drafting is no
    # longer than the gap step or a drafter's first step, whichever is longer (0: only
    # ``idle_throughput_loss`` bounds it). The gap step is ``gap_step_ms`` when that is set; by
    # default (0) it is derived from ``ttft_slowdown`` (``Planner.gap_step_s``): a drafter who
    # arrives as such a step begins waits for it and then for its own first step, and that may
    # take this many times as long as a drafter alone waits for a step of drafting and its own.
    drafting_recent_s: float = 30.0
    gap_step_ms: float = 0.0
    ttft_slowdown: float = 2.0
    # A backlog arriving at an empty engine, or left alone by the last drafter, starts with a
    # drafter's first step of documents, and each documents-only step after it may be this many
    # times the one before (0: no slow start).
    idle_ramp_factor: float = 2.0
    # Beside drafting, documents save up their spare step time and spend it in one chunk when
    # a chunk's fixed cost is more than this share of what a step may spend, or the smallest
    # chunk does not fit in it (0: never save up).
    # On since 2026-12-07: in a steady run on a float32 CPU (0.5 against 0 in one run, 3 repeats)
    # documents went 0.33x FIFO against 0.30x, drafters' ITL p95 1.23x alone against 1.05x
    # (over the repeats' requests; one repeat 1.61x), TTFT p95 1.48x both, mean ITL no longer.
    chunk_fixed_cost_share: float = 0.5
    # While documents wait for prefill, their share of the engine's time over the last steps
    # (``Planner.document_share``) is kept at least this: when drafting fills the engine (more
    # drafters than the ITL target leaves room beside, or a stream of them starting), the steps
    # that would give documents less give them ``1.5 x`` this share instead, so documents still
    # progress at about this share of their speed alone. 0: no floor (documents may starve).
    document_min_share: float = 0.2
    long_prefill_token_threshold: int = 0  # ENGINE mode: vLLM's own per-request chunk cap
    drafting_priority: int = 0  # requests at or below this priority are drafting

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "reservation", Reservation(self.reservation))
        if self.itl_slowdown < 1.0:
            raise ValueError("itl_slowdown must be at least 1")
        if self.itl_target_ms < 0:
            raise ValueError("itl_target_ms must not be negative")
        if not 0.0 < self.kv_safety_factor <= 1.0:
            raise ValueError("kv_safety_factor must be in (0, 1]")
        if not 0.0 <= self.kv_decode_reserve_fraction < 1.0:
            raise ValueError("kv_decode_reserve_fraction must be in [0, 1)")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must not be negative")
        if not 0.0 <= self.idle_throughput_loss < 0.5:
            raise ValueError("idle_throughput_loss must be in [0, 0.5)")
        if self.drafting_recent_s < 0:
            raise ValueError("drafting_recent_s must not be negative")
        if self.gap_step_ms < 0:
            raise ValueError("gap_step_ms must not be negative")
        if self.ttft_slowdown < 1.0:
            raise ValueError("ttft_slowdown must be at least 1")
        if not 0.0 <= self.chunk_fixed_cost_share < 1.0:
            raise ValueError("chunk_fixed_cost_share must be in [0, 1)")
        if not 0.0 <= self.document_min_share <= 0.5:
            raise ValueError("document_min_share must be in [0, 0.5]")
        if self.idle_ramp_factor != 0 and self.idle_ramp_factor <= 1.0:
            raise ValueError("idle_ramp_factor must be 0 (off) or above 1")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), StrEnum) else v) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PolicyConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown scheduler settings: {', '.join(sorted(unknown))}")
        return cls(**values)

    def updated(self, values: dict[str, Any]) -> PolicyConfig:
        return PolicyConfig.from_dict({**self.to_dict(), **values})


# --- the engine's state as the plan sees it ---------------------------------------------------


@dataclass(frozen=True)
class RunningRequest:
    request_id: str
    drafting: bool
    user: str
    arrival: float
    need_tokens: int  # what vLLM would schedule for it this step, unconstrained
    prefill_left: int  # prompt tokens not computed yet (0: decoding)
    context_tokens: int  # tokens computed so far


@dataclass(frozen=True)
class WaitingRequest:
    request_id: str
    drafting: bool
    user: str
    ready: bool = True  # False: vLLM would skip it anyway (e.g. waiting for a grammar)
    reserve_blocks: int = 0  # blocks its reservation needs beyond the shared prefix (``admit`` may ask)


@dataclass(frozen=True)
class StepPlan:
    hold: frozenset[str] = frozenset()  # running requests vLLM must not schedule this step
    order: tuple[str, ...] = ()  # running requests in the order vLLM should visit them
    token_budget: int | None = None  # the step's token budget; None: vLLM's own
    defer: frozenset[str] = frozenset()  # waiting requests not to start this step
    document_budget_tokens: int | None = None  # document prefill tokens allowed beside drafting
    reason: str = "no_drafting"


# --- KV admission -----------------------------------------------------------------------------


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-max(0, tokens) // block_size)


@dataclass(frozen=True)
class KvState:
    total_blocks: int
    free_blocks: int  # free now, cached-but-unused blocks included (vLLM evicts them on demand)
    running_future_blocks: int  # blocks the running requests' reservations may still claim
    free_slots: int  # max_num_seqs minus running requests


def admit(
    waiting: Sequence[WaitingRequest],
    kv: KvState,
    config: PolicyConfig,
    *,
    reserve_blocks: Callable[[WaitingRequest], int] = lambda request: request.reserve_blocks,
) -> tuple[list[str], set[str], dict[str, str]]:
    """Which waiting requests may start this step, in vLLM's order (drafting first). The first
    one that does not fit stops the rest (a large document is not starved by small ones
    behind it). ``reserve_blocks`` is asked only for the requests up to that one (counting a
    long prompt's shared prefix costs a look-up per block). Returns (admitted, deferred, why
    each deferred request waits)."""
    usable = kv.free_blocks - math.floor(kv.total_blocks * (1.0 - config.kv_safety_factor)) - kv.running_future_blocks
    reserve = math.floor(kv.total_blocks * config.kv_safety_factor * config.kv_decode_reserve_fraction)
    slots = kv.free_slots
    admitted: list[str] = []
    deferred: set[str] = set()
    why: dict[str, str] = {}
    blocked = None
    for request in waiting:
        if blocked is None and request.ready:
            limit = usable if request.drafting else usable - reserve
            need = reserve_blocks(request) if slots > 0 else 0
            if slots <= 0:
                blocked = "slots"
            elif need > limit:
                blocked = "kv_budget"
            else:
                admitted.append(request.request_id)
                usable -= need
                slots -= 1
                continue
        if blocked is not None:
            deferred.add(request.request_id)
            why[request.request_id] = blocked
    return admitted, deferred, why


def refusal(prompt_tokens: int, max_tokens: int, *, drafting: bool, total_blocks: int, block_size: int,
            config: PolicyConfig) -> str | None:  # fmt: skip
    """Why a request could never be admitted (its reservation exceeds what its kind may ever
    reserve), or None. The engine host refuses such a request at once instead of queueing it."""
    limit = math.floor(total_blocks * config.kv_safety_factor)
    if not drafting:
        limit -= math.floor(total_blocks * config.kv_safety_factor * config.kv_decode_reserve_fraction)
    need = blocks_for(prompt_tokens + max_tokens, block_size)
    if need > limit:
        return (
            f"needs {need * block_size} KV tokens ({prompt_tokens} prompt + {max_tokens} output) but at most "
            f"{limit * block_size} can ever be reserved for a {'drafting' if drafting else 'document'} request"
        )
    return None


class OutputLengths:
    """Recent output lengths per kind, for ``Reservation.PREDICTED``: a request reserves the
    90th percentile of what recent requests of its kind wrote (never more than its max), and
    its max until ``min_samples`` requests of its kind have finished."""

    def __init__(self, *, window: int = 200, min_samples: int = 20, quantile: float = 0.9) -> None:
        self.window = window
        self.min_samples = min_samples
        self.quantile = quantile
        self._lengths: dict[bool, deque[int]] = {True: deque(maxlen=window), False: deque(maxlen=window)}

    def record(self, *, drafting: bool, output_tokens: int) -> None:
        self._lengths[drafting].append(int(output_tokens))

    def forget(self) -> None:
        """Start learning again: the max is reserved until ``min_samples`` new outputs."""
        for lengths in self._lengths.values():
            lengths.clear()

    def predicted(self, *, drafting: bool) -> int | None:
        lengths = self._lengths[drafting]
        if len(lengths) < self.min_samples:
            return None
        ordered = sorted(lengths)
        return ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]

    def reserve_output(self, *, drafting: bool, max_tokens: int, reservation: Reservation) -> int:
        if reservation is Reservation.MAX:
            return max_tokens
        guess = self.predicted(drafting=drafting)
        return max_tokens if guess is None else max(1, min(max_tokens, guess))


# --- step costs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepShape:
    """What a step computes, in the terms its duration depends on."""

    decode_requests: int = 0  # requests computing one token (or a few: speculative)
    decode_context_tokens: int = 0  # their contexts, summed (attention reads them)
    prefill_tokens: int = 0  # prompt tokens computed
    prefill_attention: float = 0.0  # sum over prefill chunks of tokens x mean position

    def features(self) -> tuple[float, ...]:
        return (
            1.0,
            float(self.decode_requests),
            self.decode_context_tokens / 1e3,
            float(self.prefill_tokens),
            self.prefill_attention / 1e6,
            1.0 if self.prefill_tokens else 0.0,  # a step with any prefill runs other kernels
        )

    def with_decodes(self, contexts: Iterable[int]) -> StepShape:
        """This step with more requests decoding, of these contexts."""
        contexts = list(contexts)
        return StepShape(self.decode_requests + len(contexts), self.decode_context_tokens + sum(contexts),
                         self.prefill_tokens, self.prefill_attention)  # fmt: skip

    @classmethod
    def of(cls, decodes: Iterable[int], chunks: Iterable[tuple[int, int]]) -> StepShape:
        """From the contexts of decoding requests and the (start, tokens) of prefill chunks."""
        contexts = list(decodes)
        chunk_list = list(chunks)
        return cls(
            decode_requests=len(contexts),
            decode_context_tokens=sum(contexts),
            prefill_tokens=sum(n for _, n in chunk_list),
            prefill_attention=sum(n * (start + n / 2) for start, n in chunk_list),
        )


# The plans (``StepPlan.reason``) whose steps hold documents' work sized to a target beside
# drafting: what drafters feel of documents, and what ``StepCostModel.overrun`` measures.
SIZED_BESIDE_DRAFTING = frozenset({"drafting_running", "document_floor"})


class StepCostModel:
    """Step duration as a linear function of ``StepShape.features``, fitted by least squares
    (coefficients kept non-negative) over the engine's recent steps, refitted every
    ``refit_every`` steps: learned on the machine it runs on, CPU or GPU alike. Steps with and
    without prefill are kept apart (``window`` / 2 of each), so that a long spell of drafting
    alone does not make the model forget what prefill costs."""

    FEATURES = ("intercept_s", "per_decode_request_s", "per_1k_decode_context_s", "per_prefill_token_s",
                "per_prefill_attention_s", "prefill_step_s")  # fmt: skip

    def __init__(self, *, window: int = 512, refit_every: int = 16, min_steps: int = 32) -> None:
        self.window = window
        self.refit_every = refit_every
        self.min_steps = min_steps
        self._with_prefill: deque[tuple[tuple[float, ...], float]] = deque(maxlen=max(1, window // 2))
        self._without_prefill: deque[tuple[tuple[float, ...], float]] = deque(maxlen=max(1, window // 2))
        self._since_fit = 0
        self.coefficients: tuple[float, ...] | None = None
        self.steps_seen = 0
        # Measured / predicted, for steps the plan sized beside drafting (what drafters wait for
        # when documents share their step) and for steps of decodes alone (what they wait for alone).
        self._mixed_ratios: deque[float] = deque(maxlen=128)
        self._decode_ratios: deque[float] = deque(maxlen=128)

    @property
    def _rows(self) -> list[tuple[tuple[float, ...], float]]:
        return [*self._with_prefill, *self._without_prefill]

    def observe(self, shape: StepShape, seconds: float, *, beside_drafting: bool = False) -> None:
        """A step's shape and measured duration. ``beside_drafting``: the plan sized its
        documents' work beside drafting (``Planner.plan``, a reason in ``SIZED_BESIDE_DRAFTING``)."""
        if seconds <= 0 or (shape.decode_requests == 0 and shape.prefill_tokens == 0):
            return
        predicted = self.predict(shape)
        if predicted and shape.decode_requests:
            if shape.prefill_tokens and beside_drafting:
                self._mixed_ratios.append(seconds / predicted)
            elif not shape.prefill_tokens:
                self._decode_ratios.append(seconds / predicted)
        (self._with_prefill if shape.prefill_tokens else self._without_prefill).append((shape.features(), seconds))
        self.steps_seen += 1
        self._since_fit += 1
        if (
            self._since_fit >= self.refit_every
            and len(self._with_prefill) + len(self._without_prefill) >= self.min_steps
        ):
            self._fit()

    def _fit(self) -> None:
        import numpy as np

        self._since_fit = 0
        x = np.array([r[0] for r in self._rows], dtype=float)
        y = np.array([r[1] for r in self._rows], dtype=float)
        active = [i for i in range(x.shape[1]) if np.any(x[:, i] != x[0, i]) or i == 0]
        coefficients = np.zeros(x.shape[1])
        while active:  # least squares; a negative coefficient leaves the model (an active set)
            solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
            if np.all(solution >= 0):
                coefficients[active] = solution
                break
            active.pop(int(np.argmin(solution)))
        self.coefficients = tuple(float(c) for c in coefficients)

    def overrun(self, *, relative: bool = True, min_samples: int = 16, limit: float = 1.5) -> float:
        """How much longer than predicted the steps the plan sized beside drafting really took:
        the 80th percentile of measured / predicted over recent such steps, divided
        (``relative``) by the median of the same for steps of decodes alone, since a drafter's
        ITL is compared with its ITL alone. A fit over every step is least wrong on average, not
        at the steps that matter: measured on one CPU, steps planned to 1.4x a drafting step gave
        drafters an ITL p95 of 1.6x; on another, with the steps' chunks of a few tokens, 1.1x.
        Below 1 the plan may give documents more. Between 1 / ``limit`` and ``limit``; 1 until
        ``min_samples`` steps of each kind were seen."""
        if len(self._mixed_ratios) < min_samples:
            return 1.0
        mixed = quantile(self._mixed_ratios, 0.8)
        if relative:
            if len(self._decode_ratios) < min_samples:
                return 1.0
            mixed /= quantile(self._decode_ratios, 0.5)
        return min(limit, max(1.0 / limit, mixed))

    @classmethod
    def from_coefficients(cls, coefficients: tuple[float, ...]) -> StepCostModel:
        """A fitted model from another's ``snapshot`` (benchmarks read the engine's)."""
        model = cls()
        values = [float(c) for c in coefficients]
        model.coefficients = tuple(values + [0.0] * (len(cls.FEATURES) - len(values)))  # an older snapshot's
        return model

    def per_prefill_token_s(self, position: int) -> float:
        """What one more prompt token costs in a chunk starting at ``position`` (0 unfitted)."""
        if self.coefficients is None:
            return 0.0
        return self.coefficients[3] + self.coefficients[4] * position / 1e6

    @property
    def prices_prefill(self) -> bool:
        """Whether the fit can tell what a prompt token costs (it has seen steps with prefill)."""
        return self.coefficients is not None and (self.coefficients[3] > 0 or self.coefficients[4] > 0)

    @property
    def prefill_step_s(self) -> float:
        """What a step costs more for holding any prefill at all: a prompt chunk of a few tokens
        beside decodes is not free where prefill runs other kernels than decoding."""
        return self.coefficients[5] if self.coefficients else 0.0

    def chunk_fixed_s(self, base: StepShape) -> float:
        """What a prefill chunk adds to a step of ``base`` for being prefill at all
        (``prefill_step_s``; nothing when ``base`` holds prefill already)."""
        return 0.0 if base.prefill_tokens else self.prefill_step_s

    @property
    def ready(self) -> bool:
        return self.coefficients is not None

    def predict(self, shape: StepShape) -> float | None:
        if self.coefficients is None:
            return None
        return sum(c * f for c, f in zip(self.coefficients, shape.features(), strict=True))

    def prefill_budget(self, base: StepShape, *, position: int, target_s: float,
                       chunk_fixed_cost: bool = True) -> int | None:  # fmt: skip
        """Prefill tokens (one chunk starting at ``position``) that fit in a step beside ``base``
        within ``target_s``; None while the model is not fitted yet. ``chunk_fixed_cost``: count
        what holding any prefill costs the step (``prefill_step_s``) when ``base`` holds none."""
        if self.coefficients is None:
            return None
        fixed = self.chunk_fixed_s(base) if chunk_fixed_cost else 0.0
        spare = target_s - (self.predict(base) or 0.0) - fixed
        per_token = self.per_prefill_token_s(position)
        if per_token <= 0:
            return None  # no step with prefill seen yet: this model cannot say what a chunk costs
        if spare <= 0:
            return 0
        # Attention grows with the chunk itself: solve c3*n + c4*n*(p + n/2)/1e6 = spare for n.
        a = self.coefficients[4] / 2e6
        if a <= 0:
            return int(spare / per_token)
        return int((-per_token + math.sqrt(per_token * per_token + 4 * a * spare)) / (2 * a))

    def snapshot(self) -> dict[str, Any]:
        return {
            "steps_seen": self.steps_seen,
            "fitted": self.coefficients is not None,
            "overrun": round(self.overrun(), 3),
            **({k: v for k, v in zip(self.FEATURES, self.coefficients, strict=True)} if self.coefficients else {}),
        }


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; at least one value)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class Planner:
    """Keeps what the plan needs across steps (the cost model, who was served last) and
    makes each step's ``StepPlan``."""

    config: PolicyConfig = field(default_factory=PolicyConfig)
    max_budget_tokens: int = 2048
    cost: StepCostModel = field(default_factory=StepCostModel)
    # Document prefill tokens a step beside drafting always holds (documents always progress),
    # and holds before the cost model can tell what a chunk costs.
    min_chunk_tokens: int = 4
    unfitted_chunk_tokens: int = 64
    # Steps documents are held for one waiting drafter that vLLM then does not start (it may
    # wait for something this module cannot see): past this, documents go on beside it.
    max_hold_steps: int = 4
    # Steps of documents' floor a drafter waiting to start waits through at most, in a row; then
    # it starts. A floor step sized by the overrun may not pay back what documents are owed
    # (where steps run well over the model, it is little more than the ITL target), and
    # without this every step was a floor step while drafters waited: TTFT p95 x10.9 in a burst
    # run beside a test suite.
    max_floor_steps_waited: int = 2
    _floor_steps_waited: int = 0
    # A drafter's prompt, for the gaps between drafters, until some have been seen.
    default_draft_prompt_tokens: int = 64
    _served_at: dict[str, int] = field(default_factory=dict)
    _drafting_seen_at: float | None = None
    _draft_prompts: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    _draft_prompt_seen: dict[str, None] = field(default_factory=dict)
    _held_for: dict[str, int] = field(default_factory=dict)
    _ramp_tokens: int | None = None  # the next documents-only step's cap while starting up
    _restart_ramp: bool = (
        False  # the next documents-only prefill step starts slowly (drafting or calibration came first)
    )
    _gap_tokens: int | None = None  # the last documents-only step's tokens while drafting was recent
    _credit_s: float = 0.0  # step time documents have saved up beside drafting (``pooled_document_budget``)
    _saved_steps: int = 0  # steps that saved it
    # Documents-only steps held to ``unfitted_chunk_tokens`` while the cost model cannot price a
    # prompt token yet (a fresh or restarted engine), at most this many.
    max_calibration_steps: int = 64
    _calibration_steps: int = 0
    _step: int = 0
    # Documents' share of the engine's time (``document_share``): the cost model's estimates of
    # each step's time and of the documents' part of it, summed over the steps in which
    # documents wanted prefill, each older step counting ``share_decay`` times less (a memory of
    # some 30 steps).
    share_decay: float = 0.97
    _share_documents_s: float = 0.0
    _share_steps_s: float = 0.0
    # What documents are owed of the engine's time: each step adds ``document_min_share`` of its
    # time and takes away what documents had of it. A floor step comes once that is
    # ``floor_after_steps`` steps' worth of the floor (a drafter's few steps of starting hold
    # documents back for it at once, as ever), and what is owed or banked is bounded by about
    # that, so that neither a long spell of holding nor one of documents alone is paid back in
    # a long run of floor steps or of starving.
    floor_after_steps: int = 4
    _owed_s: float = 0.0
    # Documents' decodes held beside drafting, by request: steps held since they last ran.
    _decode_waits: dict[str, int] = field(default_factory=dict)
    # Measured durations of the last steps that held drafting alone (``note_step``), from
    # ``min_drafting_steps`` on: what bounds a saved-up chunk's step (``pooled_step_s``).
    min_drafting_steps: int = 32
    _drafting_steps: deque[float] = field(default_factory=lambda: deque(maxlen=256))

    def target_step_s(self, base: StepShape) -> float | None:
        if self.config.itl_target_ms > 0:
            return self.config.itl_target_ms / 1000.0
        alone = self.cost.predict(base)
        return None if alone is None else alone * self.config.itl_slowdown

    def sized_target_s(self, base: StepShape) -> float | None:
        """The ITL target for a step beside ``base``, less what such steps have lately overrun
        the cost model by (``StepCostModel.overrun``)."""
        target = self.target_step_s(base)
        return None if target is None else target / self.cost.overrun(relative=self.config.itl_target_ms <= 0)

    def document_budget(self, base: StepShape, position: int) -> int:
        """Document prefill tokens allowed in a step beside the drafting work ``base``: what the
        ITL target leaves (``sized_target_s``), at least ``min_chunk_tokens``, at most the
        step's budget."""
        return self._document_budget(base, position, self.sized_target_s(base))

    def _document_budget(self, base: StepShape, position: int, target: float | None) -> int:
        budget = None if target is None else self.cost.prefill_budget(base, position=position, target_s=target)
        if budget is None:  # the model cannot tell yet: small chunks, until it has seen some
            budget = self.unfitted_chunk_tokens
        return max(self.min_chunk_tokens, min(self.max_budget_tokens, budget))

    def pooled_document_budget(self, base: StepShape, position: int, *, target_s: float | None = None) -> int:
        """``document_budget``, where a chunk's own fixed cost (``StepCostModel.prefill_step_s``,
        and the attention it reads) is large beside what a step may spend, or a chunk of
        ``min_chunk_tokens`` does not fit in it: then documents save
        up each step's spare time and spend it in one chunk, in a step no longer than
        ``pooled_step_s`` (what drafters feel alone at p95), and hold back in the others.
        Drafters' mean step stays at the target; the fixed cost is paid once per saved-up chunk
        instead of every step (on one CPU a 4-token chunk beside 3 drafters made their steps
        1.65x, not 1.4x: its fixed cost alone overran the target). Each step saves at least what
        a chunk of ``min_chunk_tokens`` would have cost it, fixed cost included, so documents
        always progress by at least that many tokens a step on average, and drafters' mean step
        is no longer than with such a chunk in every step. 0: documents hold back this step. ``target_s``: the step's
        target when the caller sized it already (``sized_target_s`` of the drafting work alone,
        when ``base`` holds documents' decodes too)."""
        # Sized once a step: the overrun it divides by sorts its history.
        target = self.sized_target_s(base) if target_s is None else target_s
        per_step = self._document_budget(base, position, target)
        alone = self.cost.predict(base)
        if alone is None or target is None or base.prefill_tokens or not self.cost.prices_prefill:
            # Nothing to size by, a drafter's prompt is read in the step (no fixed cost), or the
            # model cannot price a prompt token yet.
            return per_step
        fixed = self.cost.chunk_fixed_s(base)
        spare = target - alone
        # What a chunk of ``min_chunk_tokens`` costs the step, its fixed cost included.
        floor = fixed + self.min_chunk_tokens * self.cost.per_prefill_token_s(position)
        share = self.config.chunk_fixed_cost_share
        # Saved up where a chunk's fixed cost is large beside the step's spare time, or where the
        # smallest chunk does not fit in it at all (every step would overrun the target by it):
        # the fit cannot always tell a chunk's fixed cost from its tokens' (on one CPU it gave
        # 0 ms at the end of one repeat of the steady benchmark and 4-25 ms elsewhere in the same
        # run, and documents read a chunk every step, paying the fixed cost each time, in that
        # repeat).
        if not share or (fixed <= share * spare and floor <= spare):  # cheap enough every step (a GPU), or asked to
            self._credit_s, self._saved_steps = 0.0, 0
            return per_step
        # Each step saves what a chunk of ``min_chunk_tokens`` would have cost it, or the spare
        # time when that is more: drafters' mean step is no longer than with such a chunk every
        # step, and documents read several times as many tokens in it (the fixed cost paid once
        # per chunk, not every step).
        cap = max(spare, self.pooled_step_s(base, target) - alone, floor)
        self._credit_s = min(cap, self._credit_s + max(spare, floor))
        self._saved_steps += 1
        # Spent once the credit reaches the cap, or once the tokens owed (``min_chunk_tokens`` a
        # saving step) would no longer fit in a step of the cap a step later: the chunk's step
        # stays within the cap by the model either way.
        affordable = self.cost.prefill_budget(base, position=position, target_s=alone + cap) or 0
        if self._credit_s < cap and (self._saved_steps + 1) * self.min_chunk_tokens <= affordable:
            return 0
        tokens = self.cost.prefill_budget(base, position=position, target_s=alone + self._credit_s) or 0
        tokens = max(tokens, self._saved_steps * self.min_chunk_tokens)  # the floor, whatever the model says
        self._credit_s, self._saved_steps = 0.0, 0
        return min(self.max_budget_tokens, tokens)

    def note_step(self, seconds: float, *, drafting_only: bool) -> None:
        """A step's measured duration; ``drafting_only``: it held drafting requests' work and
        nothing of documents' (what drafters feel alone, ``drafting_step_p95_s``)."""
        if drafting_only and seconds > 0:
            self._drafting_steps.append(seconds)

    def forget_drafting_steps(self) -> None:
        self._drafting_steps.clear()

    def drafting_step_p95_s(self) -> float | None:
        """The 95th percentile of the recent steps that held drafting alone, measured (None
        until ``min_drafting_steps`` were seen)."""
        if len(self._drafting_steps) < self.min_drafting_steps:
            return None
        return quantile(self._drafting_steps, 0.95)

    def pooled_step_s(self, base: StepShape, target: float) -> float:
        """The longest step a saved-up chunk of documents may make beside ``base``, by the cost
        model: a drafter's first step (drafters wait for one alone too), but no longer than
        ``itl_slowdown`` times what drafters lately felt at p95 in steps of drafting alone
        (``drafting_step_p95_s``, measured, so divided by how far steps beside drafting have
        lately overrun the model), and never shorter than ``target``: ``target`` itself (nothing
        saved up) until that p95 is known. Where drafters start often,
        their p95 alone is a step reading a new drafter's prompt, and a chunk step of that length
        adds nothing to it; where they seldom do, it is a decode step, and a chunk step as long
        as a first step would have been their ITL p95 (in one steady run on a CPU before this
        bound, x1.91 alone)."""
        felt = self.drafting_step_p95_s()
        if felt is None:
            return target
        longest = min(
            self._first_step_s(base) or target, self.config.itl_slowdown * felt / self.cost.overrun(relative=False)
        )
        return max(target, longest)

    def document_share(self) -> float | None:
        """Documents' share of the engine's time over the last steps in which they wanted
        prefill, by the cost model's estimates (None: no such step since documents last had
        nothing to read, or the model cannot tell yet)."""
        if self._share_steps_s <= 0:
            return None
        return self._share_documents_s / self._share_steps_s

    def _owed_floor(self, base: StepShape) -> bool:
        """Whether documents are owed ``floor_after_steps`` steps' worth of their floor (steps
        like ``base``)."""
        share = self.config.document_min_share
        step = self.cost.predict(base)
        return share > 0 and step is not None and self._owed_s >= self.floor_after_steps * share * step

    def floor_target_s(self, drafters: StepShape) -> float | None:
        """How long a step beside the drafting work ``drafters`` may take when documents are owed
        their floor: long enough for their work (decodes and prefill) to take 1.5 x
        ``document_min_share`` of it (more than the floor, so that the owed time is paid back
        and drafting has its steps again), with the fixed cost of holding a chunk: 1.43x the
        drafting step at the default 0.2, less what steps beside drafting have lately overrun
        the cost model by, as ``sized_target_s``. (Not sized so, floor steps were 17-22 % of the
        burst benchmark's steps on a noisy CPU, each ran over as the others did, and drafting's
        ITL p95 was 1.7x alone; without a floor 1.3x.) None while the model cannot tell."""
        alone = self.cost.predict(drafters)
        share = min(0.75, 1.5 * self.config.document_min_share)
        if alone is None or share <= 0:
            return None
        floor = (alone + self.cost.chunk_fixed_s(drafters)) / (1.0 - share)
        return floor / self.cost.overrun(relative=self.config.itl_target_ms <= 0)

    def document_decodes_beside(self, drafters: StepShape, decodes: Sequence[RunningRequest], target_s: float | None,
                                *, reserve_s: float = 0.0) -> tuple[list[RunningRequest], StepShape, float]:  # fmt: skip
        """The documents' decodes a step beside the drafting work ``drafters`` holds: in turn
        (those held longest first), up to the first that would take the step past ``target_s``
        less ``reserve_s`` (room kept for a prefill chunk), all while the model cannot tell, and
        always one, so that documents writing their answers progress; the others are held for
        the step and keep their KV. Returns them, the step's shape with them, and the time they
        add to it (documents' progress, for ``document_share``). ``took_turns`` records which ran."""
        ordered = sorted(decodes, key=lambda r: (-self._decode_waits.get(r.request_id, 0), r.arrival, r.request_id))
        shape, kept = drafters, list[RunningRequest]()
        for request in ordered:
            more = shape.with_decodes([request.context_tokens])
            if kept and target_s is not None and (self.cost.predict(more) or 0.0) + reserve_s > target_s:
                break
            shape = more
            kept.append(request)
        decoding_s = max(0.0, (self.cost.predict(shape) or 0.0) - (self.cost.predict(drafters) or 0.0))
        return kept, shape, decoding_s

    def took_turns(self, decodes: Sequence[RunningRequest], ran: set[str]) -> None:
        """Counts a step held for each of ``decodes`` not in ``ran`` (their next turn comes sooner)."""
        self._decode_waits = {r.request_id: self._decode_waits.get(r.request_id, 0) + 1 for r in decodes
                              if r.request_id not in ran}  # fmt: skip

    def _chunk_reserve_s(self, drafters: StepShape, position: int) -> float:
        """What a step beside ``drafters`` keeps for documents' prefill chunk when they have one:
        the fixed cost of holding any prefill and the ``min_chunk_tokens`` they always read."""
        return self.cost.chunk_fixed_s(drafters) + self.min_chunk_tokens * self.cost.per_prefill_token_s(position)

    def _note_share(self, base: StepShape, document_tokens: int | None, position: int, *,
                    decoding_s: float = 0.0) -> None:  # fmt: skip
        """Adds a step in which documents wanted prefill to ``document_share``: ``base`` (what
        else the step holds) and the prefill tokens documents get in it (None: vLLM's whole
        budget); ``decoding_s``: what documents' decodes in ``base`` take of it. What counts for
        documents is the time their prompt tokens and decodes take, not the fixed
        cost of holding a chunk at all: 4 tokens a step beside 16 drafters on a CPU cost a fifth
        of the step and read 20 tokens a second (the overloaded run of `bench scheduling`). Not
        counted while the cost model cannot tell what the step costs."""
        tokens = self.max_budget_tokens if document_tokens is None else document_tokens
        alone = self.cost.predict(base)
        if alone is None or not self.cost.prices_prefill:
            return
        step = alone
        if tokens > 0:
            step = self.cost.predict(
                StepShape(base.decode_requests, base.decode_context_tokens, base.prefill_tokens + tokens,
                          base.prefill_attention + tokens * (position + tokens / 2),)
            ) or alone  # fmt: skip
        fixed = self.cost.chunk_fixed_s(base) if tokens > 0 else 0.0
        reading = max(0.0, step - alone - fixed) + decoding_s
        decay = self.share_decay
        self._share_documents_s = self._share_documents_s * decay + reading
        self._share_steps_s = self._share_steps_s * decay + step
        floor = self.config.document_min_share
        bound = self.floor_after_steps * floor * step
        owed = self._owed_s + floor * step - reading
        self._owed_s = max(-bound, min(bound + floor * step, owed))

    def idle_budget(self, base: StepShape, position: int) -> int | None:
        """Document prefill tokens for a step with nobody drafting: the smallest chunk that keeps
        documents within ``idle_throughput_loss`` of the speed of the step's whole budget (only
        a step's fixed cost is lost by cutting prefill finer), so that a drafter who arrives
        waits for a short step, not a long one. On a GPU, where a step's fixed cost is large
        beside its per-token cost, that is about the whole budget; on a CPU, a fraction of it.
        None (vLLM's own budget) while the cost model cannot tell."""
        coefficients = self.cost.coefficients
        loss = self.config.idle_throughput_loss
        if coefficients is None or loss <= 0:
            return None
        per_token = self.cost.per_prefill_token_s(position)
        fixed = (self.cost.predict(base) or 0.0) + self.cost.prefill_step_s
        if per_token <= 0 or fixed <= 0:
            # No fixed cost seen (the fit dropped its intercept): cutting prefill finer would look
            # free by this model and is not, so vLLM keeps its own budget.
            return None
        full = self.max_budget_tokens * per_token
        wanted = (1.0 - loss) * full / (fixed + full)  # the whole budget's efficiency, less the loss
        tokens = math.ceil(wanted * fixed / (per_token * (1.0 - wanted)))
        return max(self.min_chunk_tokens, min(self.max_budget_tokens, tokens))

    def draft_prompt_tokens(self) -> int:
        """A drafter's prompt, as the median of the recent ones."""
        if not self._draft_prompts:
            return self.default_draft_prompt_tokens
        ordered = sorted(self._draft_prompts)
        return ordered[len(ordered) // 2]

    def first_step_budget(self, base: StepShape, position: int, *, at_least_s: float = 0.0) -> int | None:
        """Document prefill tokens that fit in the time a drafter's first step would take
        (``base`` plus its prompt), or in ``at_least_s`` if that is longer. None while the model
        cannot tell."""
        first_step = self._first_step_s(base)
        if first_step is None:
            return None
        return self.cost.prefill_budget(base, position=position, target_s=max(first_step, at_least_s))

    def _first_step_s(self, base: StepShape) -> float | None:
        """How long a step of ``base`` takes with a drafter's prompt read in it."""
        return self.cost.predict(self._with_draft_prompt(base))

    def _with_draft_prompt(self, base: StepShape) -> StepShape:
        prompt = self.draft_prompt_tokens()
        return StepShape(base.decode_requests, base.decode_context_tokens, base.prefill_tokens + prompt,
                         base.prefill_attention + prompt * prompt / 2)  # fmt: skip

    def gap_budget(self, base: StepShape, position: int) -> int | None:
        """Document prefill tokens for a step in a gap between drafters: what fits in the gap
        step (``gap_step_s``) or a drafter's first step, whichever is longer."""
        return self.first_step_budget(base, position, at_least_s=self.gap_step_s() or 0.0)

    def gap_step_s(self) -> float | None:
        """The longest documents-only step between drafters: ``gap_step_ms`` when set, else the
        longest that keeps a drafter who arrives as it begins within ``ttft_slowdown`` of one who
        arrives beside drafting alone. That one waits, at worst, for a step of one drafter's
        decode and then for its own first step (``d`` and ``f``); the other for the gap step and
        its first step: ``gap + f <= s * (d + f)``, so ``gap = s * d + (s - 1) * f``, less what
        steps have lately overrun the cost model by. About 140 ms on a 2-core CPU with the small
        model (d 41 ms, f 68 ms); on a GPU, whose steps take milliseconds, tens of milliseconds.
        None while the cost model cannot tell."""
        if self.config.gap_step_ms > 0:
            return self.config.gap_step_ms / 1000.0
        alone = StepShape()
        decode = self.cost.predict(alone.with_decodes([self.draft_prompt_tokens()]))
        first = self._first_step_s(alone)
        if decode is None or first is None:
            return None
        s = self.config.ttft_slowdown
        return max(0.0, s * decode + (s - 1.0) * first) / self.cost.overrun(relative=True)

    def _note_drafting(self, running: Sequence[RunningRequest], waiting: Sequence[WaitingRequest], now: float) -> bool:
        """Remember when drafting was last seen and how long drafters' prompts are; True while
        it was seen within ``drafting_recent_s``."""
        drafters = [r for r in running if r.drafting]
        if drafters or any(w.drafting for w in waiting):
            self._drafting_seen_at = now
        for r in drafters:
            if r.request_id not in self._draft_prompt_seen and r.prefill_left > 0 and r.context_tokens == 0:
                self._draft_prompt_seen[r.request_id] = None
                self._draft_prompts.append(r.prefill_left)
        while len(self._draft_prompt_seen) > 256:
            del self._draft_prompt_seen[next(iter(self._draft_prompt_seen))]
        recent = self.config.drafting_recent_s
        return self._drafting_seen_at is not None and recent > 0 and now - self._drafting_seen_at <= recent

    def _slow_start(self, idle: int | None, base: StepShape, position: int, *, empty: bool,
                    reason: str = "no_drafting") -> tuple[int | None, str]:  # fmt: skip
        """A documents-only step while the engine starts up from empty (``empty``: this is the
        first such step, at an empty engine or just after the last drafter left): the first as long as a
        drafter's first step (``unfitted_chunk_tokens`` while the cost model cannot tell), each
        next one ``idle_ramp_factor`` times the one before, until the 2 % rule's ``idle`` is
        reached (or vLLM's whole budget, when that rule cannot tell either: a fresh engine, or
        one that has only seen drafting). Returns the step's document tokens (None: vLLM's own
        budget) and the plan's reason (``reason`` once the ramp is over)."""
        factor = self.config.idle_ramp_factor
        if empty:
            self._ramp_tokens = None
            if factor:
                first = self.first_step_budget(base, position)
                self._ramp_tokens = max(self.min_chunk_tokens, self.unfitted_chunk_tokens if first is None else first)
        ceiling = self.max_budget_tokens if idle is None else idle
        if self._ramp_tokens is None or self._ramp_tokens >= ceiling:
            self._ramp_tokens = None
            return idle, reason
        tokens = self._ramp_tokens
        self._ramp_tokens = math.ceil(tokens * factor)
        return tokens, "slow_start"

    def fair_order(self, documents: Sequence[RunningRequest]) -> list[RunningRequest]:
        """Documents in mid-prefill: users in turn (served longest ago first), within a user the
        document with the least prefill left first."""
        by_user: dict[str, list[RunningRequest]] = {}
        for request in sorted(documents, key=lambda r: (r.prefill_left, r.arrival)):
            by_user.setdefault(request.user, []).append(request)
        users = sorted(by_user, key=lambda u: (self._served_at.get(u, -1), min(r.arrival for r in by_user[u])))
        ordered: list[RunningRequest] = []
        while any(by_user.values()):
            for user in users:
                if by_user[user]:
                    ordered.append(by_user[user].pop(0))
        return ordered

    def plan(self, running: Sequence[RunningRequest], waiting: Sequence[WaitingRequest], admitted: Sequence[str],
             deferred: set[str], *, now: float | None = None) -> StepPlan:  # fmt: skip
        """``now``: a monotonic clock's reading (``time.monotonic()`` when not given)."""
        self._step += 1
        drafting_recent = self._note_drafting(running, waiting, time.monotonic() if now is None else now)
        drafting = [r for r in running if r.drafting]
        doc_decodes = [r for r in running if not r.drafting and r.prefill_left == 0]
        doc_prefills = self.fair_order([r for r in running if not r.drafting and r.prefill_left > 0])
        order = tuple(r.request_id for r in [*sorted(drafting, key=lambda r: r.arrival), *doc_decodes, *doc_prefills])
        admitted_set = set(admitted)
        starting = [w.request_id for w in waiting if w.drafting and w.request_id in admitted_set]
        position = doc_prefills[0].context_tokens if doc_prefills else 0
        # Documents want prefill: in mid-prefill, or waiting to start (and not deferred by admission).
        prefilling = bool(doc_prefills) or any(not w.drafting for w in waiting if w.request_id not in deferred)
        if not prefilling:  # documents that come next start with a share of their own
            self._share_documents_s = self._share_steps_s = self._owed_s = 0.0
        # The drafting work alone, which the ITL target is a multiple of, and with documents' decodes.
        drafters = StepShape.of(
            [r.context_tokens for r in drafting if r.prefill_left == 0],
            [(r.context_tokens, r.need_tokens) for r in drafting if r.prefill_left > 0],
        )
        base = drafters.with_decodes(r.context_tokens for r in doc_decodes)
        starved = prefilling and bool(drafting or starting) and self._owed_floor(base)
        if starting and starved and self._floor_steps_waited >= self.max_floor_steps_waited:
            starved = False  # a drafter has waited through enough floor steps: it starts now
        self._floor_steps_waited = self._floor_steps_waited + 1 if starting and starved else 0
        # A step given to documents' floor does not count against a drafter waiting to start.
        self._held_for = {rid: self._held_for.get(rid, 0) + (0 if starved else 1) for rid in starting}
        drafting_waiting = any(n <= self.max_hold_steps for n in self._held_for.values())
        if doc_prefills:
            self._served_at[doc_prefills[0].user] = self._step
        if drafting or any(w.drafting for w in waiting):
            # Drafting sizes the steps now (or will, once a drafter that waits can start): a slow
            # start follows it out.
            self._ramp_tokens = None
            self._restart_ramp = True
        if drafting_waiting and not starved:
            # A drafter can start: documents hold their prefill for this step, and no document
            # starts in it, so the drafter's prompt gets the step; documents' decodes go on
            # within the target of that step.
            first = self._with_draft_prompt(drafters)
            kept, with_decodes, decoding_s = self.document_decodes_beside(
                first, doc_decodes, self.sized_target_s(first)
            )
            ran = {r.request_id for r in kept}
            self.took_turns(doc_decodes, ran)
            if prefilling:
                self._note_share(with_decodes, 0, position, decoding_s=decoding_s)
            hold = frozenset(r.request_id for r in [*doc_prefills, *doc_decodes] if r.request_id not in ran)
            defer = deferred | {w.request_id for w in waiting if not w.drafting}
            return StepPlan(hold=hold, order=order, defer=frozenset(defer), reason="drafting_waiting")
        if drafting or drafting_waiting:
            target = self.sized_target_s(drafters)
            # Drafting has had the engine to itself too long: documents take their floor in this
            # step (unless what the ITL target leaves is more), and a drafter waiting to start
            # starts after it (``max_floor_steps_waited``).
            floor = self.floor_target_s(drafters) if starved else None
            flooring = floor is not None and (target is None or floor > target)
            reserve = self._chunk_reserve_s(drafters, position) if prefilling else 0.0
            kept, base, decoding_s = self.document_decodes_beside(drafters, doc_decodes, floor if flooring else target,
                                                                  reserve_s=reserve)  # fmt: skip
            documents = 0
            if not flooring:
                if prefilling:
                    documents = self.pooled_document_budget(base, position, target_s=target)
                else:
                    documents = self._document_budget(base, position, target)
                if floor is not None and not documents:  # saving up its chunk while owed the floor
                    flooring = True
                    kept, base, decoding_s = self.document_decodes_beside(drafters, doc_decodes, floor,
                                                                          reserve_s=reserve)  # fmt: skip
            if flooring:
                documents, reason = self._document_budget(base, position, floor), "document_floor"
            else:
                reason = "drafting_running" if documents else "drafting_saving"
            ran = {r.request_id for r in kept}
            self.took_turns(doc_decodes, ran)
            if prefilling:
                left = sum(r.prefill_left for r in doc_prefills)
                waiting_documents = any(not w.drafting for w in waiting if w.request_id not in deferred)
                self._note_share(base, documents if waiting_documents else min(documents, left), position,
                                 decoding_s=decoding_s)  # fmt: skip
            fixed = sum(r.need_tokens for r in [*drafting, *kept])
            return StepPlan(
                hold=frozenset(r.request_id for r in doc_decodes if r.request_id not in ran),
                order=order,
                token_budget=max(1, min(self.max_budget_tokens, fixed + documents)),
                defer=frozenset(deferred),
                document_budget_tokens=documents,
                reason=reason,
            )
        self._credit_s, self._saved_steps = 0.0, 0  # nobody drafting: documents go at full speed
        self._decode_waits = {}  # and every document decodes
        # Documents that wait to start are bounded as those in mid-prefill are: unbounded, a
        # backlog arriving at an idle engine would start with one step of the whole budget
        # (seconds on a CPU) that every drafter arriving just after it waits for.
        idle = self.idle_budget(base, position) if prefilling else None
        reason = "no_drafting"
        if prefilling and not self.cost.prices_prefill and self._calibration_steps < self.max_calibration_steps:
            # A fresh engine (or one that has seen only drafting) cannot size a step of documents:
            # small steps until the fit has seen what prompt tokens cost, rather than vLLM's whole
            # budget, seconds on a CPU, that the first drafters of a burst waited for (TTFT p95
            # x2.65 in the first repeat of the burst benchmark on a fresh engine).
            self._calibration_steps += 1
            self._restart_ramp = True  # then a slow start from a drafter's first step
            # Two sizes in turn: chunks all of one size would leave a prompt token's cost and a
            # step's fixed cost indistinguishable to the fit.
            tokens = self.unfitted_chunk_tokens // (1 + self._calibration_steps % 2)
            calibrating = min(self.max_budget_tokens, sum(r.need_tokens for r in doc_decodes) + tokens)
            return StepPlan(order=order, token_budget=calibrating, defer=frozenset(deferred),
                            document_budget_tokens=tokens, reason="calibrating")  # fmt: skip
        if prefilling:
            if drafting_recent:
                gap = self.gap_budget(base, position)
                if gap is not None and (idle is None or gap < idle):
                    idle, reason = max(self.min_chunk_tokens, min(self.max_budget_tokens, gap)), "drafting_gap"
            elif self._gap_tokens is not None and self.config.idle_ramp_factor and not self._restart_ramp:
                # The window of recent drafting has just run out: ramp from the gap's step to the
                # 2 % rule's rather than jump (a drafter arriving then waited a whole 0.7 s step).
                self._ramp_tokens = math.ceil(self._gap_tokens * self.config.idle_ramp_factor)
            idle, reason = self._slow_start(idle, base, position, empty=not running or self._restart_ramp,
                                            reason=reason)  # fmt: skip
            self._restart_ramp = False
            self._gap_tokens = idle if drafting_recent else None
        if prefilling:
            self._note_share(base, idle, position)
        budget = None if idle is None else min(self.max_budget_tokens, sum(r.need_tokens for r in doc_decodes) + idle)
        return StepPlan(order=order, token_budget=budget, defer=frozenset(deferred), document_budget_tokens=idle,
                        reason=reason)  # fmt: skip
