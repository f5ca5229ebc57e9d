"""Prefill instances (disaggregated) and static-batch instances (aggregated, HF/UELLM-like)."""

from __future__ import annotations

from bucketserve.scheduling import InstanceStats, PrefillBatch
from bucketserve.scheduling.memory import blocks_for
from bucketserve.sim.workload import SimRequest


class PrefillWorker:
    """Runs one prefill batch at a time; prompt KV stays here until the decode side pulls it."""

    def __init__(
        self,
        instance_id: str,
        total_blocks: int,
        block_size: int,
        latency,
        kv_bytes: int,
        padded: bool,
    ):
        self.instance_id = instance_id
        self.total_blocks = self.free_blocks = total_blocks
        self.block_size, self.latency, self.kv_bytes, self.padded = (
            block_size,
            latency,
            kv_bytes,
            padded,
        )
        self.busy = False
        self.held = 0  # requests whose KV waits to be pulled
        self.busy_s = 0.0
        self.last_s = 0.0

    def stats(self) -> InstanceStats:
        return InstanceStats(
            self.instance_id, "prefill", self.total_blocks, self.free_blocks, self.block_size,
            1 if self.busy else 0, self.last_s, self.kv_bytes, pending_handoffs=self.held,
        )  # fmt: skip

    def start(self, batch: PrefillBatch) -> float:
        self.busy = True
        for meta in batch.requests:
            self.free_blocks -= blocks_for(meta.prompt_len, self.block_size)
        t = self.latency.prefill_time([m.prompt_len for m in batch.requests], self.padded)
        self.busy_s += t
        self.last_s = t
        return t

    def finish(self, batch: PrefillBatch) -> None:
        self.busy = False
        self.held += batch.size

    def release(self, prompt_len: int) -> None:
        """The decode side pulled one request's KV."""
        self.free_blocks += blocks_for(prompt_len, self.block_size)
        self.held -= 1


class StaticWorker:
    """Aggregated static batching: prefill the padded batch, decode it until the longest ends.

    Finished sequences keep their slot (HF generate pads them); each request's tokens stream,
    so its finish time is when its own last token is produced.
    """

    def __init__(
        self, instance_id: str, total_blocks: int, block_size: int, latency, kv_bytes: int
    ):
        self.instance_id, self.total_blocks, self.block_size = instance_id, total_blocks, block_size
        self.latency, self.kv_bytes = latency, kv_bytes
        self.busy = False
        self.busy_s = 0.0
        self.batch_reqs: list[SimRequest] = []

    def stats(self) -> InstanceStats:
        free = self.total_blocks if not self.busy else 0
        return InstanceStats(
            self.instance_id, "mixed", self.total_blocks, free, self.block_size,
            len(self.batch_reqs), 0.0, self.kv_bytes,
        )  # fmt: skip

    def run(self, reqs: list[SimRequest], now: float) -> tuple[float, float]:
        """Lay out the whole batch's timeline; returns (prefill seconds, total seconds)."""
        self.busy = True
        self.batch_reqs = reqs
        n = len(reqs)
        longest = max(r.meta.prompt_len for r in reqs)
        prefill = self.latency.prefill_time([r.meta.prompt_len for r in reqs], True)
        t = now + prefill
        for r in reqs:
            r.record_token(t)
        remaining = sorted(reqs, key=lambda r: r.output_len)
        produced = 1
        while remaining and remaining[0].output_len <= produced:
            remaining.pop(0).finish_s = t
        while remaining:
            t += self.latency.decode_time(n, n * (longest + produced))
            produced += 1
            for r in remaining:
                r.record_token(t)
            while remaining and remaining[0].output_len <= produced:
                remaining.pop(0).finish_s = t
        self.busy_s += t - now
        return prefill, t - now

    def finish(self) -> list[SimRequest]:
        self.busy = False
        done, self.batch_reqs = self.batch_reqs, []
        return done
