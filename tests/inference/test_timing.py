"""inference/timing.py: percentiles and per-request timings from arrival times."""

from __future__ import annotations

import pytest

from inference.timing import Delta, inter_token_latencies_ms, percentile, request_timing


def test_percentile_linear_interpolation_on_1_to_100():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0


def test_percentile_ignores_input_order():
    assert percentile([30.0, 10.0, 20.0], 50) == 20.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)


def test_percentile_single_value():
    assert percentile([7.5], 95) == 7.5
    assert percentile([7.5], 0) == 7.5


def test_percentile_empty_is_none():
    assert percentile([], 95) is None


def test_percentile_two_values():
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_percentile_does_not_mutate_input():
    values = [3.0, 1.0, 2.0]
    percentile(values, 50)
    assert values == [3.0, 1.0, 2.0]


def test_inter_token_latencies_one_token_per_delta():
    deltas = [Delta(at=10.0, tokens=1), Delta(at=10.1, tokens=1), Delta(at=10.3, tokens=1)]
    assert inter_token_latencies_ms(deltas) == pytest.approx([100.0, 200.0])


def test_inter_token_latencies_split_a_multi_token_delta():
    deltas = [Delta(at=10.0, tokens=1), Delta(at=10.3, tokens=3)]
    assert inter_token_latencies_ms(deltas) == pytest.approx([100.0, 100.0, 100.0])


def test_inter_token_latencies_first_delta_tokens_do_not_count():
    # Only gaps between deltas: 5 tokens in the first delta give no latencies.
    assert inter_token_latencies_ms([Delta(at=1.0, tokens=5)]) == []
    assert inter_token_latencies_ms([]) == []


def test_inter_token_latencies_skip_empty_deltas_and_clamp_negative_gaps():
    deltas = [Delta(at=1.0, tokens=1), Delta(at=1.5, tokens=0), Delta(at=1.4, tokens=2)]
    # The zero-token delta adds nothing; the clock going backwards gives 0, not negative.
    assert inter_token_latencies_ms(deltas) == [0.0, 0.0]


def test_request_timing_full():
    created, started = 100.0, 100.25
    deltas = [
        Delta(at=100.5, tokens=2),  # first delta: ttft
        Delta(at=100.7, tokens=1),
        Delta(at=101.5, tokens=4),
    ]
    timing = request_timing(created_at=created, started_at=started, deltas=deltas)
    assert timing.queue_wait_ms == pytest.approx(250.0)
    assert timing.ttft_ms == pytest.approx(500.0)  # from created_at, not started_at
    assert timing.output_tokens == 7
    # Decode speed: tokens after the first delta (1 + 4) over the span first->last (1.0 s).
    assert timing.decode_tokens_per_s == pytest.approx(5.0)
    # ITLs: 200 ms (1 token), then 800/4 = 200 ms four times.
    assert timing.itl_mean_ms == pytest.approx(200.0)
    assert timing.itl_p95_ms == pytest.approx(200.0)


def test_request_timing_itl_statistics():
    deltas = [Delta(at=0.0, tokens=1)] + [Delta(at=0.01 * i, tokens=1) for i in range(1, 20)]
    deltas.append(Delta(at=1.19, tokens=1))  # one slow token (1 s gap)
    timing = request_timing(created_at=0.0, started_at=0.0, deltas=deltas)
    # 19 gaps of 10 ms and one of 1000 ms.
    assert timing.itl_mean_ms == pytest.approx((19 * 10 + 1000) / 20)
    expected_p95 = percentile([10.0] * 19 + [1000.0], 95)
    assert timing.itl_p95_ms == pytest.approx(expected_p95)
    assert timing.itl_p95_ms > 10.0


def test_request_timing_without_deltas():
    timing = request_timing(created_at=10.0, started_at=10.5, deltas=[])
    assert timing.queue_wait_ms == pytest.approx(500.0)
    assert timing.ttft_ms is None
    assert timing.itl_mean_ms is None
    assert timing.itl_p95_ms is None
    assert timing.decode_tokens_per_s is None
    assert timing.output_tokens == 0


def test_request_timing_only_empty_deltas_counts_as_no_deltas():
    timing = request_timing(created_at=10.0, started_at=10.0, deltas=[Delta(at=11.0, tokens=0)])
    assert timing.ttft_ms is None
    assert timing.output_tokens == 0


def test_request_timing_ttft_skips_leading_empty_delta():
    deltas = [Delta(at=10.2, tokens=0), Delta(at=10.8, tokens=1)]
    timing = request_timing(created_at=10.0, started_at=10.1, deltas=deltas)
    assert timing.ttft_ms == pytest.approx(800.0)


def test_request_timing_single_delta_has_no_decode_rate():
    timing = request_timing(created_at=0.0, started_at=0.0, deltas=[Delta(at=0.4, tokens=3)])
    assert timing.ttft_ms == pytest.approx(400.0)
    assert timing.output_tokens == 3
    assert timing.decode_tokens_per_s is None
    assert timing.itl_mean_ms is None
    assert timing.itl_p95_ms is None


def test_request_timing_negative_queue_wait_is_clamped():
    timing = request_timing(created_at=10.0, started_at=9.0, deltas=[])
    assert timing.queue_wait_ms == 0.0
