"""Hybrid instances: per-instance chunk budgets, decode-only instances fed by hand-offs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests


def run(cluster, latency, budgets, rate=3.0, n=150):
    cl = replace(cluster, topology="hybrid", chunk_budgets=budgets)
    sim = Simulator("fcfs", make_requests(WorkloadSpec("mixed", n, rate, seed=2)), cl, latency)
    return sim, sim.run()


def test_prefill_heavy_instances_hand_decodes_to_decode_only_ones(cluster, latency):
    sim, out = run(cluster, latency, (2048, 2048, 0, 0))
    assert all(not math.isnan(r.finish_s) for r in out.requests)
    assert all(r.num_gaps == r.output_len - 1 for r in out.requests)  # every token timed
    assert sim.engine.migrations == sum(r.output_len > 1 for r in out.requests)
    heavy, decode = sim.engine.workers[:2], sim.engine.workers[2:]
    assert all(w.busy_s > 0 for w in sim.engine.workers)
    assert all(w.free_blocks == w.total_blocks and not w.reqs for w in heavy + decode)
    assert len(sim.sched.ledger) == 0 and sim.sched.num_waiting == 0


def test_equal_mixed_budgets_are_sarathi(cluster, latency):
    _, hybrid = run(cluster, latency, (512,) * 4)
    chunked = Simulator("fcfs", make_requests(WorkloadSpec("mixed", 150, 3.0, seed=2)),
                        replace(cluster, topology="chunked"), latency).run()  # fmt: skip
    assert [r.finish_s for r in hybrid.requests] == [r.finish_s for r in chunked.requests]


def test_budgets_must_match_the_instances(cluster):
    with pytest.raises(ValueError, match="chunk_budgets"):
        replace(cluster, topology="hybrid", chunk_budgets=(512, 0))
    with pytest.raises(ValueError, match="chunk_budgets"):
        replace(cluster, topology="hybrid", chunk_budgets=(0, 0, 0, 0))
