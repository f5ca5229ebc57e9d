"""The scheduler's approximate prefix index and the cached-overlap vs load placement rule."""

from __future__ import annotations

import pytest
from bucketserve.scheduling.prefix_index import PrefixIndex, by_affinity


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
