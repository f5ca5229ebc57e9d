"""Prefix caching in the simulator: the shared-prefix workload, the server's colocated
placement (least loaded vs prefix-aware), the engines' real prefix cache, and no leaks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.prefix import PrefixWorkload, prefix_requests
from bucketserve.sim.prefix_report import format_summary, main, run_arm
from bucketserve.sim.simulator import Simulator

# 4 prefixes x 32 blocks on 2 instances of 160 blocks: every prefix fits on one instance
# only if each instance keeps to about half of them (placement decides)
SPEC = PrefixWorkload(num_requests=160, rate=3.0, num_prefixes=4, prefix_tokens=512,
                      max_tokens=64, seed=3)  # fmt: skip


def small(cluster: ClusterSpec, placement: str) -> ClusterSpec:
    return replace(cluster, kv_blocks=160, num_aggregated=2, topology="chunked",
                   placement=placement, prefix_caching=True)  # fmt: skip


def simulate(cluster, latency, placement: str) -> Simulator:
    sim = Simulator("bucketserve", prefix_requests(SPEC), small(cluster, placement), latency)
    sim.run()
    return sim


def hit_share(sim: Simulator) -> float:
    blocks = [w.blocks for w in sim.engine.workers]
    return sum(b.num_hit_tokens for b in blocks) / sum(b.num_queried_tokens for b in blocks)


def test_workload_shares_prefixes_and_is_deterministic():
    reqs = prefix_requests(SPEC)
    groups = {r.meta.task_type for r in reqs}
    assert groups == {f"prefix{i}" for i in range(4)}
    same = [r for r in reqs if r.meta.task_type == "prefix0"][:2]
    assert same[0].prompt_ids[:512] == same[1].prompt_ids[:512]
    assert same[0].prompt_ids[512:] != same[1].prompt_ids[512:]
    assert all(r.meta.prompt_len == len(r.prompt_ids) for r in reqs)
    again = prefix_requests(SPEC)
    assert [r.prompt_ids for r in again] == [r.prompt_ids for r in reqs]
    hot = prefix_requests(replace(SPEC, hot_share=0.8))
    assert sum(r.meta.task_type == "prefix0" for r in hot) > 0.75 * len(hot)
    with pytest.raises(ValueError, match="prefix_tokens"):
        PrefixWorkload(prefix_tokens=4000)


def test_prefix_aware_placement_hits_more_and_answers_sooner(cluster, latency):
    runs = {p: simulate(cluster, latency, p) for p in ("least_loaded", "prefix_aware")}
    for sim in runs.values():
        reqs = sim.out.requests
        assert all(not math.isnan(r.finish_s) for r in reqs)  # nothing lost
        assert sum(sim.router.placed.values()) == len(reqs) and not sim.router.unplaced
        for w in sim.engine.workers:  # every block free (cached ones evictable): no leak
            assert w.blocks.num_free_blocks == w.blocks.num_total_blocks
    least, aware = (hit_share(runs[p]) for p in ("least_loaded", "prefix_aware"))
    assert aware > least + 0.1
    ttft = {p: sum(r.first_token_s - r.meta.arrival_s for r in s.out.requests)
            for p, s in runs.items()}  # fmt: skip
    assert ttft["prefix_aware"] < ttft["least_loaded"]
    # the scheduler saw the uncached length: requests after the first of a prefix were
    # bucketed by what prefill computes
    assert any(r.meta.num_cached_tokens >= 496 for r in runs["prefix_aware"].out.requests)


def test_placement_needs_the_chunked_topology(cluster):
    with pytest.raises(ValueError, match="needs topology 'chunked'"):
        replace(cluster, placement="prefix_aware")
    with pytest.raises(ValueError, match="placement must be one of"):
        replace(cluster, topology="chunked", placement="random")


def test_report_rows_and_summary(cluster, latency):
    base = replace(small(cluster, "least_loaded"), placement="pull", prefix_caching=False)
    rows = [run_arm(arm, replace(SPEC, num_requests=60, rate=rate), base, latency, "bucketserve")
            for arm in ("no cache", "prefix-aware") for rate in (1.0, 2.0)]  # fmt: skip
    assert {r["arm"] for r in rows} == {"no cache", "prefix-aware"}
    assert all(r["finished"] == r["requests"] == 60 for r in rows)
    assert all(r["hit_share"] == 0.0 for r in rows if r["arm"] == "no cache")
    assert all(r["hit_share"] > 0.5 for r in rows if r["arm"] == "prefix-aware")
    table = format_summary(rows, 0.9)
    assert "| prefix-aware |" in table and "goodput@0.9" in table
    assert main(["--rates", "0"]) == 2  # a bad rate is an error, not a crash
