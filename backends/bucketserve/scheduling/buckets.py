"""Request Bucketing Manager: length buckets and the paper's Algorithm 1 (split/merge).

A bucket owns [low, high) of prompt lengths; a request sits in the bucket containing its
length, in arrival order. Requests are never promoted to another bucket; only boundaries move.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from bucketserve.scheduling.request import RequestMeta


@dataclass(slots=True)
class Bucket:
    """Interval [low, high) and its waiting requests, oldest first."""

    low: int
    high: int
    requests: dict[str, RequestMeta] = field(default_factory=dict)
    num_below_mid: int = 0  # kept by BucketManager so Algorithm 1's test is O(1)

    @property
    def mid(self) -> int:
        return (self.low + self.high) // 2

    def __len__(self) -> int:
        return len(self.requests)

    def oldest(self) -> RequestMeta | None:
        return next(iter(self.requests.values()), None)

    def share_below_mid(self) -> float:
        return self.num_below_mid / len(self.requests) if self.requests else 0.0

    def put(self, meta: RequestMeta) -> None:
        self.requests[meta.request_id] = meta
        self.num_below_mid += meta.bucket_len < self.mid

    def take(self, request_id: str) -> RequestMeta:
        meta = self.requests.pop(request_id)
        self.num_below_mid -= meta.bucket_len < self.mid
        return meta


class BucketManager:
    """Owns the buckets and which request sits where."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._buckets: list[Bucket] = [Bucket(0, max_len)]
        self._lows: list[int] = [0]
        self._where: dict[str, Bucket] = {}
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self.total_tokens = 0

    @property
    def buckets(self) -> list[Bucket]:
        return self._buckets

    @property
    def total(self) -> int:
        return len(self._where)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._where

    def bucket_for(self, length: int) -> Bucket:
        return self._buckets[bisect_right(self._lows, min(length, self.max_len - 1)) - 1]

    def add(self, meta: RequestMeta) -> Bucket:
        bucket = self.bucket_for(meta.bucket_len)
        bucket.put(meta)
        self._where[meta.request_id] = bucket
        self._seq[meta.request_id] = self._next_seq
        self._next_seq += 1
        self.total_tokens += meta.bucket_len
        return bucket

    def remove(self, request_id: str) -> RequestMeta | None:
        bucket = self._where.pop(request_id, None)
        if bucket is None:
            return None
        del self._seq[request_id]
        meta = bucket.take(request_id)
        self.total_tokens -= meta.bucket_len
        return meta

    def mean_len(self) -> float:
        return self.total_tokens / self.total if self.total else 0.0

    def all_requests(self) -> Iterator[RequestMeta]:
        """Every waiting request, oldest first (by add order)."""
        metas = [m for b in self._buckets for m in b.requests.values()]
        return iter(sorted(metas, key=lambda m: self._seq[m.request_id]))

    def boundaries(self) -> list[tuple[int, int]]:
        return [(b.low, b.high) for b in self._buckets]

    def cuts(self) -> list[int]:
        """Inner boundaries (every low except the first)."""
        return self._lows[1:]

    def queue_lengths(self) -> list[int]:
        return [len(b) for b in self._buckets]

    def set_cuts(self, cuts: list[int]) -> None:
        """Replace the boundaries by [0, c1), [c1, c2), ..., [ck, max_len); keep arrival order."""
        edges = [0, *sorted({c for c in cuts if 0 < c < self.max_len}), self.max_len]
        metas = list(self.all_requests())
        self._buckets = [Bucket(lo, hi) for lo, hi in zip(edges, edges[1:], strict=False)]
        self._lows = edges[:-1]
        for meta in metas:
            bucket = self.bucket_for(meta.bucket_len)
            bucket.put(meta)
            self._where[meta.request_id] = bucket

    def split(self, bucket: Bucket) -> None:
        """Bisect one bucket at its midpoint (Algorithm 1, lines 19-27)."""
        if bucket.high - bucket.low < 2:
            return
        self.set_cuts([*self.cuts(), bucket.mid])

    def merge_all(self) -> None:
        """Collapse every bucket into one [0, max_len) (Algorithm 1, lines 11-13)."""
        if len(self._buckets) > 1:
            self.set_cuts([])


class TaskTypeBuckets:
    """One BucketManager per task type: the seed groups a request "into a bucket based on its
    sequence length and task type", so types never share a bucket and Algorithm 1 splits and
    merges each type's buckets on its own. Same interface as BucketManager (less the cuts)."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        # the untyped group always exists: an idle manager shows Algorithm 1's one bucket
        self.groups: dict[str, BucketManager] = {"": BucketManager(max_len)}
        self._where: dict[str, BucketManager] = {}

    @property
    def buckets(self) -> list[Bucket]:
        return [b for g in self.groups.values() for b in g.buckets]

    @property
    def total(self) -> int:
        return len(self._where)

    @property
    def total_tokens(self) -> int:
        return sum(g.total_tokens for g in self.groups.values())

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._where

    def add(self, meta: RequestMeta) -> Bucket:
        group = self.groups.setdefault(meta.task_type, BucketManager(self.max_len))
        self._where[meta.request_id] = group
        return group.add(meta)

    def remove(self, request_id: str) -> RequestMeta | None:
        group = self._where.pop(request_id, None)
        return group.remove(request_id) if group is not None else None

    def mean_len(self) -> float:
        return self.total_tokens / self.total if self.total else 0.0

    def all_requests(self) -> Iterator[RequestMeta]:
        metas = [m for g in self.groups.values() for m in g.all_requests()]
        return iter(sorted(metas, key=lambda m: m.arrival_s))

    def boundaries(self) -> list[tuple[int, int]]:
        return [(b.low, b.high) for b in self.buckets]

    def queue_lengths(self) -> list[int]:
        return [len(b) for b in self.buckets]


def rebalance(
    manager: BucketManager | TaskTypeBuckets,
    n_max: int,
    threshold: float = 0.5,
    cap: int | None = None,
) -> str:
    """Algorithm 1's load-driven step; returns "merge", "split" or "none".

    Merge everything when fewer than N_max requests wait. When more than N_max wait, split
    (repeatedly, as the children are checked again) every bucket holding more than N_max
    requests of which more than `threshold` lie below its midpoint. `cap` (not in the paper)
    stops splitting at that many buckets. Per task type when the manager groups by type.
    """
    if isinstance(manager, TaskTypeBuckets):
        actions = {rebalance(g, n_max, threshold, cap) for g in manager.groups.values()}
        return next((a for a in ("split", "merge") if a in actions), "none")
    if manager.total < n_max:
        if len(manager.buckets) > 1:
            manager.merge_all()
            return "merge"
        return "none"
    if manager.total == n_max:
        return "none"
    action = "none"
    while cap is None or len(manager.buckets) < cap:
        target = next((b for b in manager.buckets if _should_split(b, n_max, threshold)), None)
        if target is None:
            return action
        manager.split(target)
        action = "split"
    return action


def _should_split(bucket: Bucket, n_max: int, threshold: float) -> bool:
    wide = bucket.high - bucket.low >= 2
    return wide and len(bucket) > n_max and bucket.share_below_mid() > threshold
