"""The online latency model, the boundary planner and the monitor."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import SchedulerConfig
from bucketserve.scheduling.boundaries import (
    BoundaryPlanner,
    LengthHistogram,
    cuts_objective,
    log_edges,
    optimal_cuts,
)
from bucketserve.scheduling.latency_model import BilinearLatencyModel
from bucketserve.scheduling.monitor import GlobalMonitor


def test_latency_prior_then_fit_recovers_bilinear_truth():
    model = BilinearLatencyModel(tokens_per_s=5000.0, overhead_s=0.02)
    assert model.predict(1, 5000) == pytest.approx(1.02, rel=1e-6)  # prior: overhead + N*L/rate

    def truth(n, length):
        return 2e-5 * n * length + 1e-3 * n + 5e-5 * length + 0.03

    for n in (1, 2, 4, 8, 16):
        for length in (32, 128, 512, 2048):
            model.observe(n, length, truth(n, length))
    for n, length in ((3, 300), (12, 1500), (1, 64)):
        assert model.predict(n, length) == pytest.approx(truth(n, length), rel=0.05)
    assert model.num_observations == 20


def test_log_edges_and_histogram_decay():
    edges = log_edges(4096, 1)
    assert edges == [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    h = LengthHistogram(4096, 1, half_life_s=10.0)
    h.observe(100, 0.0)
    h.observe(100, 10.0)  # the first observation decayed by half
    (row,) = h.occupied()
    assert row[:2] == (64, 128) and row[2] == pytest.approx(1.5)


def test_dp_cuts_separate_short_and_long_modes():
    bins = [(64, 128, 90.0, 90 * 84.0), (2048, 4096, 10.0, 10 * 3584.0)]
    assert optimal_cuts(bins, max_buckets=8, penalty=32.0) == [2048]
    assert optimal_cuts(bins, max_buckets=1, penalty=32.0) == []
    one = cuts_objective(bins, [], 32.0)
    two = cuts_objective(bins, [2048], 32.0)
    assert two < one


def test_dp_penalty_limits_bucket_count():
    bins = [(lo, lo * 2, 1.0, lo * 1.5) for lo in (16, 32, 64, 128, 256, 512, 1024, 2048)]
    many = optimal_cuts(bins, max_buckets=8, penalty=0.0)
    few = optimal_cuts(bins, max_buckets=8, penalty=1000.0)
    assert len(many) == 7 and len(few) < len(many)


def test_planner_hysteresis_and_interval():
    cfg = SchedulerConfig(max_model_len=4096, block_size=16, recut_interval_s=1.0)
    planner = BoundaryPlanner(cfg)
    for i in range(90):
        planner.observe(80, i * 0.01)
    for i in range(10):
        planner.observe(3500, 0.9 + i * 0.01)
    cuts = planner.maybe_recut(1.0, [])
    assert cuts and len(cuts) >= 1
    assert planner.maybe_recut(1.5, []) is None  # within the interval
    assert planner.maybe_recut(3.0, cuts) is None  # no better than current: keep


def test_monitor_arrival_rate_and_decisions():
    mon = GlobalMonitor(alpha=0.5)
    for i in range(20):
        mon.observe_arrival(i * 0.25, 100)
    assert mon.arrival_rate == pytest.approx(4.0)
    mon.record_decision(10e-6, 0.2)
    mon.record_decision(30e-6, None)
    assert mon.mean_decision_us == pytest.approx(20.0) and mon.batches == 1
