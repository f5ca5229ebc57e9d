"""Baseline policies: static batches, vLLM-like FCFS, DistServe-like disaggregated FCFS."""

from __future__ import annotations

from collections.abc import Iterable

from bucketserve.scheduling.base import BaseScheduler, Ordered
from bucketserve.scheduling.cluster import InstanceStats
from bucketserve.scheduling.memory import Budget, blocks_for
from bucketserve.scheduling.request import RequestMeta


class FcfsScheduler(BaseScheduler):
    """vLLM-like: one queue, FCFS, prefill batches up to a token budget, no buckets."""

    name = "fcfs"
    default_reserve = "none"

    def _preferred(self, now: float) -> Ordered:
        only = self.buckets.buckets[0]  # never split: the whole queue in arrival order
        return only.requests.values(), (only.low, only.high)

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        cap = self.config.token_budget()
        chosen: list[RequestMeta] = []
        tokens = 0
        for meta in ordered:
            if chosen and tokens + meta.prompt_len > cap:
                break
            if not self._claim(meta, budget):
                break
            chosen.append(meta)
            tokens += meta.prompt_len
        return chosen


class DistServeScheduler(FcfsScheduler):
    """DistServe-like: the same FCFS token-budget prefill batches, on disaggregated P/D.

    The scheduling rule equals fcfs; the difference is the deployment (separate prefill and
    decode instances), which the simulator models for this policy.
    """

    name = "distserve"


class StaticScheduler(BaseScheduler):
    """HF generate / UELLM-style: a fixed batch runs to completion; the next starts after it.

    A batch goes out only when its decode target is empty (no running, pending or unfinished
    request of ours). Memory is reserved as a padded batch: N x (longest prompt + max_tokens).
    """

    name = "static"
    default_reserve = "max"

    def _preferred(self, now: float) -> Ordered:
        only = self.buckets.buckets[0]
        return only.requests.values(), (only.low, only.high)

    def _may_dispatch(self, decode: InstanceStats, now: float) -> bool:
        idle = decode.running == 0 and decode.pending_handoffs == 0
        return idle and self.ledger.count(decode.instance_id) == 0

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        chosen: list[RequestMeta] = []
        longest = out = 0
        bs = budget.block_size
        for meta in ordered:
            if len(chosen) >= min(self.config.static_batch_size, budget.seqs):
                break
            n = len(chosen) + 1
            new_longest, new_out = max(longest, meta.prompt_len), max(out, meta.max_tokens)
            if n * blocks_for(new_longest, bs) > budget.prefill_blocks:
                break
            if chosen and budget.tokens is not None and n * new_longest > budget.tokens:
                break  # a padded batch computes n x longest prompt tokens
            if n * blocks_for(new_longest + new_out, bs) > budget.decode_blocks:
                break
            chosen.append(meta)
            longest, out = new_longest, new_out
        return chosen
