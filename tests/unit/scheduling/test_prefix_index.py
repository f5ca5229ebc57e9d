"""The scheduler's approximate prefix index and the cached-overlap vs load placement rule."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import InstanceStats, RequestMeta, SchedulerConfig, make_scheduler
from bucketserve.scheduling.cluster import ClusterView
from bucketserve.scheduling.prefix_index import ColocatedPlacement, PrefixIndex, by_affinity


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overlap_counts_leading_blocks_per_instance():
    index = PrefixIndex(clock=Clock())
    index.record("a", [1, 2, 3])
    index.record("b", [1, 2, 9])
    assert index.overlap([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert index.overlap([7, 2, 3]) == {}  # only a leading run counts (the hashes are chained)
    index.forget("a")
    assert index.overlap([1, 2, 3]) == {"b": 2}


def test_entries_expire_and_are_bounded():
    clock = Clock()
    index = PrefixIndex(ttl_s=10.0, max_entries=3, clock=clock)
    index.record("a", [1, 2])
    clock.now = 5.0
    index.record("b", [1])
    clock.now = 12.0  # a's record of blocks 1 and 2 is older than the TTL, b's is not
    assert index.overlap([1, 2]) == {"b": 1}
    index.record("c", [7, 8, 9])  # over max_entries: the least recently sent go first
    assert index.overlap([1]) == {} and index.overlap([7, 8, 9]) == {"c": 3}
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        PrefixIndex(ttl_s=0)


def test_affinity_prefers_the_cache_until_the_load_gap_is_too_large():
    ids = ["a", "b"]
    overlap = {"b": 60}  # b probably holds 960 of the 1,000 prompt tokens
    assert by_affinity(ids, overlap, {"a": 0, "b": 300}, 1000, 16, 2048) == ["b", "a"]
    # cached overlap is worth less than b's extra load: a computes all 1,000 but is idle
    assert by_affinity(ids, overlap, {"a": 0, "b": 1500}, 1000, 16, 2048) == ["a", "b"]
    # past the balance threshold the least loaded goes first, whatever it caches
    assert by_affinity(ids, {"a": 60}, {"a": 3000, "b": 0}, 1000, 16, 2048) == ["b", "a"]
    assert by_affinity(ids, {}, {}, 10, 16, 2048) == ["a", "b"]


def stats(name: str, backlog: int = 0, running: int = 0, free: int = 1000) -> InstanceStats:
    return InstanceStats(name, "mixed", 1000, free, 16, running, 0.05, 1,
                         prefill_backlog=backlog)  # fmt: skip


def test_colocated_placement_waits_for_the_busy_prefix_holder_then_gives_up():
    clock = Clock()
    index = PrefixIndex(clock=clock)
    prefix = list(range(1, 129))  # b probably holds 128 blocks (2,048 tokens) of the prompt
    index.record("b", prefix)
    place = ColocatedPlacement(index, max_hold_s=0.25, clock=clock)
    a, b = stats("a"), stats("b", backlog=600)  # b's intake is closed for now
    is_open = lambda s: s.prefill_backlog < 512  # noqa: E731
    ask = prefix + [500, 501]  # a 2,100-token prompt: 2,100 to compute on a, 52 + 600 on b
    assert place.offer("r1", [a, b], is_open, ask, 2100) == []  # held for b
    clock.now = 0.2
    assert place.offer("r1", [a, b], is_open, ask, 2100) == []
    clock.now = 0.3  # held longer than max_hold_s: it goes to the open instance
    assert place.offer("r1", [a, b], is_open, ask, 2100) == [a]
    assert place.num_holds == 1
    b_open = stats("b", backlog=100)
    assert place.offer("r2", [a, b_open], is_open, ask, 2100) == [b_open, a]
    # a short prompt: b's 600-token backlog outweighs its 48 cached tokens, a goes first
    index.record("b", [7, 8, 9])
    assert place.offer("r3", [a, b], is_open, [7, 8, 9, 10], 80) == [a]


def test_colocated_placement_holds_only_for_more_overlap_and_balanced_loads():
    index = PrefixIndex(clock=Clock())
    index.record("a", [1, 2])
    index.record("b", [1, 2])
    place = ColocatedPlacement(index, clock=Clock())
    is_open = lambda s: s.prefill_backlog < 512  # noqa: E731
    a, b = stats("a", backlog=10), stats("b", backlog=600)
    # a caches as much as b: no reason to wait for b
    assert place.offer("r", [a, b], is_open, [1, 2, 3], 80) == [a]
    # only b caches it, but b is 3,000 tokens busier (past balance_tokens): least loaded
    index.record("b", [1, 2, 3])
    busy_b = stats("b", backlog=3000)
    assert place.offer("r", [a, busy_b], is_open, [1, 2, 3, 4], 80) == [a]
    assert ColocatedPlacement(None).offer("r", [b, a], is_open, [1], 80) == [a]  # no index
    # b would be chosen (2,100 - 208 + 520 < 2,100 + 400) but holds only 13 blocks (208
    # tokens) more than a: not worth waiting for (min_hold_tokens)
    index.record("b", list(range(100, 113)))
    busy_a, closed_b = stats("a", backlog=400), stats("b", backlog=520)
    ask = list(range(100, 232))
    assert place.offer("r", [busy_a, closed_b], is_open, ask, 2100) == [busy_a]
    assert ColocatedPlacement(index, min_hold_tokens=128, clock=Clock()).offer(
        "r", [busy_a, closed_b], is_open, ask, 2100) == []  # fmt: skip
    assert place.num_holds == 0


def test_colocated_reservation_counts_a_probably_cached_prefix_once():
    """Colocated, the blocks of a prefix the request will probably find cached are shared:
    its reservation covers only its own; disaggregated, decode gets every prompt block."""
    cfg = SchedulerConfig.with_overrides({}, max_model_len=4096, block_size=16)
    reserved = {}
    for cached in (0, 2048):
        for colocated in (True, False):
            sched = make_scheduler("bucketserve", cfg, lambda: 0.0)
            sched.add(RequestMeta("r", 2100, 64, 0.0, num_cached_tokens=cached))
            p = stats("gpu0")
            d = p if colocated else InstanceStats("decode0", "decode", 1000, 1000, 16, 0, 0.05, 1)
            view = ClusterView([p], [d]) if colocated else ClusterView([stats("gpu0")], [d])
            batch = sched.next_batch(view)
            assert batch is not None
            reserved[cached, colocated] = sched.ledger.reserved(d.instance_id)
    assert reserved[2048, True] < reserved[0, True] - 100  # 128 shared blocks not counted
    assert reserved[2048, False] == reserved[0, False]
