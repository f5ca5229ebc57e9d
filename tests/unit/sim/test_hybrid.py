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


def assert_clean(sim, out) -> None:
    """Every request finished with every token timed; no block, ledger entry or queue left."""
    assert all(not math.isnan(r.finish_s) for r in out.requests)
    assert all(r.num_gaps == r.output_len - 1 for r in out.requests)
    assert all(w.free_blocks == w.total_blocks and not w.reqs for w in sim.engine.workers)
    assert len(sim.sched.ledger) == 0 and sim.sched.num_waiting == 0


def test_decodes_leave_a_prefill_heavy_instance_when_their_slack_runs_out(cluster, latency):
    quiet, quiet_out = run(cluster, latency, (2048, 2048, 0, 0), rate=1.0, n=60)
    busy, busy_out = run(cluster, latency, (2048, 2048, 0, 0), rate=8.0, n=400)
    assert_clean(quiet, quiet_out)
    assert_clean(busy, busy_out)
    assert all(w.busy_s > 0 for w in busy.engine.workers)
    # queued prompts make a heavy instance's next step long: decodes leave; idle, they stay
    share = busy.engine.migrations / sum(r.output_len > 1 for r in busy_out.requests)
    quiet_share = quiet.engine.migrations / sum(r.output_len > 1 for r in quiet_out.requests)
    assert share > 2 * quiet_share, (share, quiet_share)


def test_a_moved_decode_keeps_its_tokens(cluster, latency):
    sim, out = run(cluster, latency, (2048, 2048, 0, 0), rate=8.0, n=400)
    assert sim.engine.migrations > 0
    assert [r.num_gaps + 1 for r in out.requests] == [r.output_len for r in out.requests]


def adaptive(cluster, latency, tpot_s, rate=6.0, n=600):
    cl = replace(cluster, topology="hybrid", adaptive_roles=True)
    reqs = make_requests(WorkloadSpec("mixed", n, rate, seed=2, tpot_s=tpot_s))
    sim = Simulator("fcfs", reqs, cl, latency)
    return sim, sim.run()


def test_adaptive_roles_stay_mixed_while_both_slos_hold(cluster, latency):
    sim, out = adaptive(cluster, latency, tpot_s=0.2, rate=2.0, n=200)
    chunked = Simulator("fcfs", make_requests(WorkloadSpec("mixed", 200, 2.0, seed=2, tpot_s=0.2)),
                        replace(cluster, topology="chunked"), latency).run()  # fmt: skip
    assert sim.engine.layouts == [(0.0, (512,) * 4)] and sim.engine.controller.changes == 0
    assert [r.finish_s for r in out.requests] == [r.finish_s for r in chunked.requests]


def test_adaptive_roles_split_when_tpot_binds(cluster, latency):
    # fused iterations of 512 tokens take longer than a 30 ms TPOT: decodes must leave them
    sim, out = adaptive(cluster, latency, tpot_s=0.03)
    assert_clean(sim, out)
    budgets = [b for _, b in sim.engine.layouts]
    assert budgets[0] == (512,) * 4 and (2048, 2048, 0, 0) in budgets
    assert sim.engine.migrations > 0


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
