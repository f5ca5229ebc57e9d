"""P/D Scheduler, faithful to BucketServe: Algorithm 1 buckets, Eq. 6 batches, oldest-first.

* Online requests: serve the bucket holding the earliest-arrived online request, FCFS inside.
* Offline requests: SJF (requests/s) or LJF (tokens/s) inside the bucket (config.offline_order).
* Batch size: Eq. 6 over the chosen requests' prompt lengths, from live free memory.
* Buckets: Algorithm 1 (merge under N_max, midpoint split of left-heavy buckets above N_max),
  re-run on every arrival and before every decision.
The decode side is continuous batching on the engine; admission here only keeps each batch's
prompts (plus one token each, vLLM-style on-demand growth) inside the decode pool.

Ablations (SchedulerConfig.enable_*): without bucketing every request shares one bucket;
without the batch controller a batch is static_batch_size requests (the block budget still
applies); without priority the oldest request's bucket goes first and is served FCFS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain

from bucketserve.scheduling.base import BaseScheduler, Ordered
from bucketserve.scheduling.batch_controller import DynamicBatchingController
from bucketserve.scheduling.buckets import Bucket, TaskTypeBuckets, rebalance
from bucketserve.scheduling.cluster import InstanceStats
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.memory import Budget
from bucketserve.scheduling.request import RequestMeta


def oldest_bucket(buckets: list[Bucket], online: bool) -> Bucket | None:
    """The bucket whose earliest request of the given class arrived first."""
    best: tuple[float, Bucket] | None = None
    for bucket in buckets:
        first = next((m for m in bucket.requests.values() if m.is_online == online), None)
        if first is not None and (best is None or first.arrival_s < best[0]):
            best = (first.arrival_s, bucket)
    return best[1] if best else None


class BucketServeScheduler(BaseScheduler):
    """The paper's scheduler (policy "bucketserve")."""

    name = "bucketserve"
    default_reserve = "none"

    def __init__(self, config: SchedulerConfig, clock: Callable[[], float]) -> None:
        super().__init__(config, clock)
        if config.bucket_by_task_type:  # the seed: buckets by sequence length and task type
            self.buckets = TaskTypeBuckets(config.max_model_len)
        self.controller = DynamicBatchingController(config.memory_safety)
        self.last_action = "none"

    def _rebalance(self) -> None:
        if not self.config.enable_bucketing:
            return
        n_max = self.controller.n_max(self.buckets.mean_len())
        if n_max is not None:
            self.last_action = rebalance(self.buckets, n_max, cap=self.config.bucket_cap)

    def _on_add(self, meta: RequestMeta) -> None:
        self._rebalance()

    def _prepare(self, prefill: InstanceStats, decode: InstanceStats, now: float) -> None:
        self.controller.capacity(prefill, decode)
        self._rebalance()

    def _preferred(self, now: float) -> Ordered:
        if not self.config.enable_priority:
            bucket = min(
                (b for b in self.buckets.buckets if b.requests),
                key=lambda b: b.oldest().arrival_s,
            )
            return iter(bucket.requests.values()), (bucket.low, bucket.high)
        bucket = oldest_bucket(self.buckets.buckets, True) or oldest_bucket(
            self.buckets.buckets, False
        )
        assert bucket is not None, "called with an empty queue"
        online = (m for m in bucket.requests.values() if m.is_online)
        ljf = self.config.offline_order == "ljf"
        offline = sorted(
            (m for m in bucket.requests.values() if not m.is_online),
            key=lambda m: m.prompt_len,
            reverse=ljf,
        )
        return chain(online, offline), (bucket.low, bucket.high)

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        """Eq. 6: the longest prefix whose prompt lengths fit M_safe (at least one if it fits)."""
        capacity = self.controller.last_capacity or 0
        is_static = not self.config.enable_batch_controller
        chosen: list[RequestMeta] = []
        total = 0
        for meta in ordered:
            total += meta.prompt_len
            if is_static and len(chosen) == self.config.static_batch_size:
                break
            if not is_static and chosen and total > capacity:
                break
            if not self._claim(meta, budget):
                break
            chosen.append(meta)
        return chosen

    def _extra(self) -> dict[str, float]:
        n_max = self.controller.n_max(self.buckets.mean_len())
        return {
            "n_max": float(n_max if n_max is not None else -1),
            "capacity_tokens": float(self.controller.last_capacity or 0),
        }
