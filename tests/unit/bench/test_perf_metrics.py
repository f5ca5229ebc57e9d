"""Metrics math: per-request timing, SLO attainment, goodput interpolation, summaries."""

from __future__ import annotations

import pytest
from bucketserve.bench.metrics import Goodput, attainment, cdf, goodput, summarize
from bucketserve.bench.prom import delta, parse
from bucketserve.bench.records import RequestRecord, read_jsonl, write_jsonl


def rec(ttft, tpot, ok=True, idx=0, n_out=5, t_send=0.0):
    r = RequestRecord(idx, "alpaca", 1.0, t_send, 10, n_out, 1.0, 0.1)
    if ok:
        r.ttft_s, r.tpot_s, r.e2e_s, r.output_tokens = ttft, tpot, ttft + tpot * (n_out - 1), n_out
    else:
        r.error = "boom"
    return r


def test_chunks_give_ttft_tpot_and_per_token_itl():
    r = RequestRecord(0, "a", 1.0, 0.0, 10, 5, 1.0, 0.1)
    r.add_chunk(0.5, 1)
    r.add_chunk(0.6, 2)
    r.add_chunk(0.9, 5)  # a coalesced response carrying three tokens
    r.add_chunk(0.95, 5)  # the empty FINAL response adds no token
    r.finish(0.95)
    assert r.ttft_s == 0.5 and r.output_tokens == 5
    assert r.itl_s == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert r.tpot_s == pytest.approx(0.1)
    assert r.ok and r.meets_slo()


def test_attainment_needs_both_slos_and_counts_failures():
    rs = [rec(0.5, 0.05), rec(1.5, 0.05), rec(0.5, 0.2), rec(0, 0, ok=False)]
    assert attainment(rs) == pytest.approx(0.25)
    assert attainment(rs, scale=2.0) == pytest.approx(0.75)
    assert attainment([]) is None  # nothing sent: undefined, not 0 %


def test_goodput_interpolates_between_rates():
    g = goodput([1, 2, 3, 4], [1.0, 0.95, 0.85, 0.5], 0.9)
    assert g.kind == "interpolated" and g.rate == pytest.approx(2.5)
    assert goodput([3, 1, 2], [0.85, 1.0, 0.95], 0.9).rate == pytest.approx(2.5)  # any order


def test_goodput_takes_the_highest_rate_attaining_the_target():
    g = goodput([1, 2, 3, 4], [0.95, 0.85, 0.92, 0.6], 0.9)
    assert g.rate == pytest.approx(3 + (0.92 - 0.9) / (0.92 - 0.6))


def test_goodput_edges():
    assert goodput([1, 2], [1.0, 0.99], 0.9) == Goodput(0.9, 2, "at-least")
    assert goodput([1, 2], [0.5, 0.1], 0.9) == Goodput(0.9, 0.0, "below-range")
    with pytest.raises(ValueError):
        goodput([1], [0.5, 0.6], 0.9)


def test_summary_throughput_and_latency():
    rs = [rec(0.5, 0.1, idx=i, t_send=float(i)) for i in range(4)]  # e2e 0.9 s each
    s = summarize("p", 1.0, rs + [rec(0, 0, ok=False, idx=4, t_send=4.0)])
    assert s.sent == 5 and s.ok == 4 and s.failed == 1
    assert s.makespan_s == pytest.approx(3.9)
    assert s.served_rate == pytest.approx(4 / 3.9)
    assert s.output_tok_s == pytest.approx(20 / 3.9)
    assert s.attainment == pytest.approx(0.8)
    assert s.ttft_p50 == pytest.approx(0.5)


def test_cdf_is_monotone_to_one():
    x, y = cdf([3.0, 1.0, 2.0, None])
    assert list(x) == [1.0, 2.0, 3.0] and y[-1] == 1.0


def test_jsonl_round_trip(tmp_path):
    rs = [rec(0.5, 0.1, idx=1), rec(0, 0, ok=False, idx=2)]
    write_jsonl(rs, tmp_path / "r.jsonl")
    back = read_jsonl(tmp_path / "r.jsonl")
    assert [r.idx for r in back] == [1, 2] and back[0].ttft_s == 0.5 and not back[1].ok


def test_prometheus_deltas():
    before = parse(
        'bucketserve_scheduler_decision_seconds_total{policy="x"} 1.0\n'
        'bucketserve_e2e_request_latency_seconds_sum{instance="d0"} 10\n'
        'bucketserve_e2e_request_latency_seconds_count{instance="d0"} 5\n'
    )
    after = parse(
        '# HELP x\nbucketserve_scheduler_decision_seconds_total{policy="x"} 1.5\n'
        'bucketserve_e2e_request_latency_seconds_sum{instance="d0"} 60\n'
        'bucketserve_e2e_request_latency_seconds_count{instance="d0"} 15\n'
    )
    d = delta(before, after)
    assert d.requests == 10 and d.sched_s_per_request == pytest.approx(0.05)
    assert d.sched_share == pytest.approx(0.01)


def test_open_loop_throughput_is_over_the_send_window():
    light = summarize("p", 0.2, [rec(0.5, 0.1, t_send=1.0)], window_s=10.0)
    assert light.served_rate == pytest.approx(0.1) and light.sent_rate == pytest.approx(0.1)
    late = summarize("p", 0.2, [rec(0.5, 0.1, t_send=9.5)], window_s=10.0)  # ends at 10.4 s
    assert late.makespan_s == pytest.approx(10.4)
