"""Queue orderings as baselines: shortest-prompt-first, earliest-deadline-first, Bullet's.

Each takes the DistServe batch rule (FCFS token budget, prefill-only admission) and changes
only the order the queue is served in, so a comparison with `distserve` isolates ordering.
The starvation bound of the base class still serves anyone waiting > max_wait_s first.
"""

from __future__ import annotations

import heapq

from bucketserve.scheduling.base import Ordered
from bucketserve.scheduling.baselines import DistServeScheduler
from bucketserve.scheduling.request import RequestMeta


class SjfScheduler(DistServeScheduler):
    """Shortest prompt first (ties: oldest first)."""

    name = "sjf"
    default_admission = "prefill"  # simulator-only policy: DistServe's admission

    def _key(self, meta: RequestMeta, now: float) -> tuple:
        return (meta.prompt_len, meta.arrival_s)

    def _preferred(self, now: float) -> Ordered:
        only = self.buckets.buckets[0]
        # a batch never holds more than max_num_seqs requests: no need to sort the rest
        head = heapq.nsmallest(
            self.config.max_num_seqs, only.requests.values(), key=lambda m: self._key(m, now)
        )
        return head, (only.low, only.high)


class EdfScheduler(SjfScheduler):
    """Earliest TTFT deadline first (arrival + TTFT SLO)."""

    name = "edf"

    def _key(self, meta: RequestMeta, now: float) -> tuple:
        return (meta.ttft_deadline_s, meta.arrival_s)


class BulletOrderScheduler(SjfScheduler):
    """Bullet's prefill queue rule (its Algorithm 1, step 2): ascending predicted prefill
    latency (prompt length, as its model is monotonic in it), except that requests whose TTFT
    deadline is within `bullet_urgent_s` go first, earliest deadline first, so reordering does
    not break pending SLOs. Requests already past their deadline go last (oldest first)."""

    name = "bullet"

    def _key(self, meta: RequestMeta, now: float) -> tuple:
        slack = meta.ttft_deadline_s - now
        if slack < 0:
            return (2, meta.arrival_s, 0)
        if slack < self.config.bullet_urgent_s:
            return (0, meta.ttft_deadline_s, 0)
        return (1, meta.prompt_len, meta.arrival_s)
