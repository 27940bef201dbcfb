"""What a user felt for one request, computed from arrival times. Pure.

Times are wall-clock seconds (``time.time()``), taken in the worker as events arrive from the
engine host, so they include everything between the engine and the person but the last hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Delta:
    at: float  # when the delta arrived
    tokens: int  # how many tokens it carried


@dataclass(frozen=True)
class RequestTiming:
    queue_wait_ms: float
    ttft_ms: float | None
    itl_mean_ms: float | None
    itl_p95_ms: float | None
    decode_tokens_per_s: float | None
    output_tokens: int


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (q / 100) * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def inter_token_latencies_ms(deltas: list[Delta]) -> list[float]:
    """One latency per token after the first: a delta that carries n tokens after a gap g counts
    as n tokens g/n apart (the engine batched them into one message)."""
    latencies: list[float] = []
    for previous, current in zip(deltas, deltas[1:], strict=False):
        if current.tokens <= 0:
            continue
        gap_ms = max(0.0, (current.at - previous.at) * 1000)
        latencies.extend([gap_ms / current.tokens] * current.tokens)
    return latencies


def request_timing(*, created_at: float, started_at: float, deltas: list[Delta]) -> RequestTiming:
    deltas = [d for d in deltas if d.tokens > 0]
    output_tokens = sum(d.tokens for d in deltas)
    queue_wait_ms = max(0.0, (started_at - created_at) * 1000)
    if not deltas:
        return RequestTiming(queue_wait_ms, None, None, None, None, 0)
    ttft_ms = max(0.0, (deltas[0].at - created_at) * 1000)
    itls = inter_token_latencies_ms(deltas)
    decode_span_s = deltas[-1].at - deltas[0].at
    decode_tokens = output_tokens - deltas[0].tokens
    tokens_per_s = decode_tokens / decode_span_s if decode_span_s > 0 and decode_tokens > 0 else None
    return RequestTiming(
        queue_wait_ms=queue_wait_ms,
        ttft_ms=ttft_ms,
        itl_mean_ms=sum(itls) / len(itls) if itls else None,
        itl_p95_ms=percentile(itls, 95),
        decode_tokens_per_s=tokens_per_s,
        output_tokens=output_tokens,
    )
