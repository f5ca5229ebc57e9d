"""bucketserve+ (ours, beyond the paper): the same pipeline with four changes.

1. Boundaries from the length distribution (decayed histogram, DP cuts, hysteresis, <= K
   buckets) instead of load-driven midpoint bisection.
2. Decode admission reserves prompt + expected output blocks (learned from finished requests)
   instead of prompts only; the live free count still catches growth beyond the estimate.
3. Bucket choice by TTFT slack (earliest deadline among requests that can still make it, with
   a latency model fitted online from measured batch times); hopeless requests wait behind.
4. Batch size bounded by that model: a request joins only if every feasible member still meets
   its deadline; the starvation bound (base class) still serves anyone waiting > max_wait_s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from bucketserve.scheduling.base import Ordered
from bucketserve.scheduling.baselines import AdmissionChoice
from bucketserve.scheduling.batch import PrefillBatch
from bucketserve.scheduling.boundaries import BoundaryPlanner
from bucketserve.scheduling.buckets import Bucket
from bucketserve.scheduling.cluster import InstanceStats
from bucketserve.scheduling.config import SchedulerConfig
from bucketserve.scheduling.latency_model import BilinearLatencyModel
from bucketserve.scheduling.memory import Budget
from bucketserve.scheduling.request import RequestMeta


class BucketServePlus(AdmissionChoice):
    """Policy "bucketserve+"."""

    name = "bucketserve+"
    default_reserve = "expected"

    def __init__(self, config: SchedulerConfig, clock: Callable[[], float]) -> None:
        super().__init__(config, clock)
        self.planner = BoundaryPlanner(config)
        self.latency = BilinearLatencyModel(config.prefill_tokens_per_s, config.prefill_overhead_s)

    def _on_add(self, meta: RequestMeta) -> None:
        self.planner.observe(meta.prompt_len, meta.arrival_s)

    def _prepare(self, prefill: InstanceStats, decode: InstanceStats, now: float) -> None:
        cuts = self.planner.maybe_recut(now, self.buckets.cuts())
        if cuts is not None:
            self.buckets.set_cuts(cuts)

    def _observe_latency(self, batch: PrefillBatch, duration_s: float) -> None:
        self.latency.observe(batch.size, batch.max_len, duration_s)

    def _split_head(
        self, bucket: Bucket, now: float
    ) -> tuple[list[RequestMeta], list[RequestMeta]]:
        """The bucket's first edf_scan requests as (feasible by deadline, hopeless by arrival).

        Feasible: a batch of just this request, predicted by the fitted model, still meets its
        TTFT deadline.
        """
        a, b = self.latency.single()
        feasible, hopeless = [], []
        for meta in islice(bucket.requests.values(), self.config.edf_scan):
            ok = now + max(a + b * meta.prompt_len, 1e-4) <= meta.ttft_deadline_s
            (feasible if ok else hopeless).append(meta)
        feasible.sort(key=lambda m: m.ttft_deadline_s)
        return feasible, hopeless

    def _preferred(self, now: float) -> Ordered:
        """The bucket with the earliest feasible deadline (else the oldest request) goes next."""
        best = None
        for bucket in self.buckets.buckets:
            if not bucket.requests:
                continue
            feasible, hopeless = self._split_head(bucket, now)
            key = (0, feasible[0].ttft_deadline_s) if feasible else (1, hopeless[0].arrival_s)
            if best is None or key < best[0]:
                best = (key, bucket, feasible, hopeless)
        assert best is not None, "called with an empty queue"
        _, bucket, feasible, hopeless = best
        return [*feasible, *hopeless], (bucket.low, bucket.high)

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        """Grow the batch while memory fits and no feasible member would miss its deadline."""
        chosen: list[RequestMeta] = []
        tokens = longest = 0
        deadline = float("inf")
        for meta in ordered:
            new_longest = max(longest, meta.prompt_len)
            done_at = now + self.latency.predict(len(chosen) + 1, new_longest)
            if chosen and (
                tokens + meta.prompt_len > self.config.plus_max_batch_tokens or done_at > deadline
            ):
                continue
            if not self._claim(meta, budget):
                break
            chosen.append(meta)
            tokens += meta.prompt_len
            longest = new_longest
            if done_at <= meta.ttft_deadline_s:
                deadline = min(deadline, meta.ttft_deadline_s)
        return chosen

    def _extra(self) -> dict[str, float]:
        p1, p2, p3, p4 = self.latency.params
        return {
            "recuts": float(self.planner.recuts),
            "lat_p1": p1,
            "lat_p2": p2,
            "lat_p3": p3,
            "lat_p4": p4,
        }
