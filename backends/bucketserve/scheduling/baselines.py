"""Baseline policies: static batches, vLLM-like FCFS (packed or padding-aware), DistServe.

Admission comes in two kinds (SchedulerConfig.admission, None: the policy's default):
"headroom" (the project's: a batch must fit the prefill pool *and* the decode instance's
headroom) and "prefill" (DistServe's context scheduler: only the prefill pool is checked;
hand-offs wait on the decode side until blocks free up).
"""

from __future__ import annotations

from collections.abc import Iterable

from bucketserve.scheduling.base import BaseScheduler, Ordered, Target
from bucketserve.scheduling.cluster import ClusterView, InstanceStats
from bucketserve.scheduling.memory import Budget, blocks_for
from bucketserve.scheduling.request import RequestMeta

UNBOUNDED = 1 << 40


class AdmissionChoice(BaseScheduler):
    """Adds DistServe's prefill-only admission as an option (or default) of a policy."""

    default_admission = "headroom"

    @property
    def admission(self) -> str:
        return self.config.admission or self.default_admission

    def _target(self, view: ClusterView, now: float) -> Target | None:
        if self.admission == "headroom":
            return super()._target(view, now)
        if not view.prefill or not view.decode:
            return None
        p = min(view.prefill, key=lambda s: (-s.free_blocks, s.instance_id))
        decode_by_id = {d.instance_id: d for d in view.decode}
        if p.instance_id in decode_by_id:  # colocated: one pool, it is the prefill pool
            d = decode_by_id[p.instance_id]
        else:  # the decode instance whose pool will be freest once its queued hand-offs land
            d = min(view.decode, key=lambda s: (-self._decode_room(s), s.instance_id))
        seqs, tokens = self.config.max_num_seqs, self.config.max_prefill_tokens
        colocated = p.instance_id == d.instance_id
        return (
            p,
            d,
            Budget(p.free_blocks, UNBOUNDED, seqs, p.block_size, tokens, colocated=colocated),
        )

    def _decode_room(self, d: InstanceStats) -> int:
        return d.free_blocks - self.ledger.pending_prompt_blocks(d.instance_id, d.pending_handoffs)


class FcfsScheduler(AdmissionChoice):
    """vLLM-like: one queue, FCFS, prefill batches up to a token budget, no buckets."""

    name = "fcfs"
    default_reserve = "none"

    def _preferred(self, now: float) -> Ordered:
        only = self.buckets.buckets[0]  # never split: the whole queue in arrival order
        return only.requests.values(), (only.low, only.high)

    def _batch_tokens(self, n: int, total: int, longest: int) -> int:
        """What the token budget charges for a batch of n prompts (packed: their sum)."""
        return total

    def _take(
        self, ordered: Iterable[RequestMeta], budget: Budget, now: float
    ) -> list[RequestMeta]:
        cap = self.config.token_budget()
        chosen: list[RequestMeta] = []
        total = longest = 0
        for meta in ordered:
            n, new_longest = len(chosen) + 1, max(longest, meta.prompt_len)
            if chosen and self._batch_tokens(n, total + meta.prompt_len, new_longest) > cap:
                break
            if not self._claim(meta, budget):
                break
            chosen.append(meta)
            total, longest = total + meta.prompt_len, new_longest
        return chosen


class PadAwareFcfsScheduler(FcfsScheduler):
    """Padded-era vLLM (v0.2.x): the budget counts N x longest prompt, and a batch stops once
    its padding tokens would pass `max_paddings` (vLLM's default 256)."""

    name = "fcfs-pad"

    def _batch_tokens(self, n: int, total: int, longest: int) -> int:
        if n * longest - total > self.config.max_paddings:
            return UNBOUNDED
        return n * longest


class DistServeScheduler(FcfsScheduler):
    """DistServe-like: FCFS token-budget prefill batches on disaggregated P/D.

    DistServe's own admission checks the prefill pool only ("prefill"); the simulator uses
    that (sim.cluster.SIM_ADMISSION). The server keeps "headroom" by default because its
    decode instances fail a hand-off that waits too long for blocks. Placement search: in
    the evidence script (sim/evidence.py)."""

    name = "distserve"


class StaticScheduler(BaseScheduler):
    """HF generate-style static batches (NOT UELLM: no output predictor, no SLO-ODBS).

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
