"""The seeds' other deployments in the simulator: Bullet SM sharing, Sarathi chunks, SCLS slices."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from bucketserve.sim.metrics import summarize
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests


def run(policy, cluster, latency, rate=3.0, n=150, seed=1, **spec):
    sim = Simulator(policy, make_requests(WorkloadSpec("mixed", n, rate, seed=seed, **spec)),
                    cluster, latency)  # fmt: skip
    return sim, sim.run()


@pytest.mark.parametrize(
    ("policy", "topology", "mode"),
    [("bullet", "auto", "bullet"), ("fcfs", "chunked", "chunked"), ("edf", "chunked", "chunked"),
     ("bucketserve+", "chunked", "chunked"), ("scls", "auto", "scls")],
)  # fmt: skip
def test_every_request_finishes_and_blocks_return(policy, topology, mode, cluster, latency):
    sim, out = run(policy, replace(cluster, topology=topology), latency)
    assert out.mode == mode and out.num_gpus == 4
    assert all(not math.isnan(r.finish_s) for r in out.requests)
    assert all(r.meta.arrival_s <= r.first_token_s <= r.finish_s for r in out.requests)
    assert all(r.num_gaps == r.output_len - 1 for r in out.requests)  # every token timed
    for w in sim.engine.workers:
        assert w.free_blocks == w.total_blocks and not w.running
    assert len(sim.sched.ledger) == 0 and sim.sched.num_waiting == 0


def test_chunking_bounds_the_stall_a_long_prompt_causes(cluster, latency):
    spec = {"long_fraction": 0.3}
    _, agg = run("fcfs", replace(cluster, topology="aggregated"), latency, rate=4.0, **spec)
    _, chunked = run("fcfs", replace(cluster, topology="chunked", chunk_tokens=512), latency,
                     rate=4.0, **spec)  # fmt: skip

    # a 512-token iteration costs < 0.1 s, an unchunked 3.5k-token prefill ~0.5 s: most
    # requests see such a stall without chunks, few with them (those near a preemption's
    # recompute, which DecodeWorker does not chunk)
    def stalled(out):
        return sum(r.max_gap_s > 0.2 for r in out.requests) / len(out.requests)

    assert stalled(chunked) < 0.25 < 0.5 < stalled(agg)
    assert chunked.preemptions < agg.preemptions


def test_bullet_prefill_shares_the_gpu_with_decode(cluster, latency):
    sim, out = run("bullet", cluster, latency, rate=4.0)
    g = sim.engine.gpus[0]
    assert g.prefill_busy_s > 0 and g.w.busy_s > 0
    # overlap: prefill and decode busy time add up to more than the span on some GPU
    span = max(r.finish_s for r in out.requests)
    assert any(x.prefill_busy_s + x.w.busy_s > 0.3 * span for x in sim.engine.gpus)
    m = summarize(out, "mixed", 4.0)
    assert m.attainment > 0.9  # light load: nearly everyone meets the SLOs


def test_scls_slices_requeue_and_stall_between_slices(cluster, latency):
    sim, out = run("scls", cluster, latency, rate=2.0)
    long_out = [r for r in out.requests if r.output_len > 128]
    assert long_out and all(r.max_gap_s > 0 for r in long_out)
    assert max(sim.engine.generated.values()) >= 128  # someone was served in several slices
