"""The simulator drives the real schedulers: determinism, completion, block conservation."""

from __future__ import annotations

import math

import pytest
from bucketserve.scheduling import POLICIES
from bucketserve.sim.metrics import goodput, summarize
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests


def run(policy, cluster, latency, rate=6.0, n=120, seed=0, workload="mixed"):
    sim = Simulator(
        policy, make_requests(WorkloadSpec(workload, n, rate, seed=seed)), cluster, latency
    )
    return sim, sim.run()


def fingerprint(out):
    return [
        (r.meta.request_id, r.scheduled_s, r.first_token_s, r.finish_s, r.preemptions)
        for r in out.requests
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_finishes_and_blocks_return(policy, cluster, latency):
    sim, out = run(policy, cluster, latency)
    assert all(not math.isnan(r.finish_s) for r in out.requests)
    assert all(
        r.meta.arrival_s <= r.scheduled_s <= r.first_token_s <= r.finish_s for r in out.requests
    )
    for w in sim.decode:
        assert w.free_blocks == w.total_blocks and not w.running and not w.queue
    for w in sim.prefill:
        assert w.free_blocks == w.total_blocks and w.held == 0
    assert len(sim.sched.ledger) == 0 and sim.sched.num_waiting == 0
    assert out.mode == {"static": "static", "fcfs": "aggregated"}.get(policy, "pd")


@pytest.mark.parametrize("policy", ["bucketserve", "bucketserve+"])
def test_deterministic_for_a_seed(policy, cluster, latency):
    _, a = run(policy, cluster, latency, seed=7)
    _, b = run(policy, cluster, latency, seed=7)
    _, c = run(policy, cluster, latency, seed=8)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(c)


def test_metrics_and_overload(cluster, latency):
    _, light = run("distserve", cluster, latency, rate=1.0, n=80, workload="alpaca")
    m = summarize(light, "alpaca", 1.0)
    assert m.attainment == 1.0 and m.finished == 80 and m.num_gpus == 4
    _, heavy = run("static", cluster, latency, rate=20.0, n=200, workload="alpaca")
    h = summarize(heavy, "alpaca", 20.0)
    assert h.attainment < 0.5 and h.served_rate < 20.0


def test_preemption_under_memory_pressure(cluster, latency):
    sim, out = run("distserve", cluster, latency, rate=30.0, n=300)
    assert out.preemptions > 0  # prompt-only admission lets decode outgrow its pool
    assert all(w.free_blocks == w.total_blocks for w in sim.decode)


def test_goodput_interpolation():
    assert goodput([1, 2, 3, 4], [1.0, 0.95, 0.85, 0.5], 0.9) == pytest.approx(2.5)
    assert goodput([1, 2], [0.5, 0.4], 0.9) == 0.0
    assert goodput([1, 2], [1.0, 0.99], 0.9) == 2.0
