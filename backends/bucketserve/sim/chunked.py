"""Sarathi-style chunked prefill on aggregated instances: every iteration fuses one decode
token for each running sequence with up to (chunk_tokens - decodes) prompt tokens, so a long
prompt never stalls decode for more than one bounded iteration.

Prompts enter the prefilling list through the policy's `next_batch` (its order and
admission; their prompt blocks are taken at admission) and are chunked in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

from bucketserve.scheduling import ClusterView
from bucketserve.scheduling.memory import blocks_for
from bucketserve.sim.decode_worker import DecodeWorker, Seq
from bucketserve.sim.workload import SimRequest


@dataclass(slots=True)
class Prefilling:
    """A prompt being prefilled in chunks."""

    req: SimRequest
    blocks: int
    done: int = 0


class _Fused:
    """The latency the DecodeWorker sees: its decode step fused with the planned chunks."""

    def __init__(self, latency) -> None:
        self.latency = latency
        self.chunks: list[tuple[int, int]] = []

    def decode_time(self, batch: int, context_tokens: int) -> float:
        return self.latency.hybrid_time(batch, context_tokens, self.chunks)

    def prefill_time(self, lengths, padded: bool = False) -> float:
        return self.latency.prefill_time(lengths, padded)

    def handoff_time(self, tokens: int) -> float:
        return 0.0


class ChunkedGpu:
    def __init__(self, name: str, cluster, latency) -> None:
        self.fused = _Fused(latency)
        self.w = DecodeWorker(name, "mixed", cluster.kv_blocks, cluster.block_size,
                              cluster.max_num_seqs, self.fused, cluster.kv_bytes_per_token)  # fmt: skip
        self.prefilling: list[Prefilling] = []
        self.busy = False
        self.prefill_only_s = 0.0


class ChunkedEngine:
    """Event handlers of the chunked-prefill deployment, driven by the Simulator."""

    def __init__(self, sim) -> None:
        self.sim, c = sim, sim.cluster
        self.budget = c.chunk_tokens
        self.gpus = [ChunkedGpu(f"gpu{i}", c, sim.latency) for i in range(c.num_aggregated)]
        self.workers = [g.w for g in self.gpus]

    def on_arrival(self) -> None:
        for g in self.gpus:
            self._iterate(g)

    def busy_s(self) -> float:
        return sum(g.w.busy_s + g.prefill_only_s for g in self.gpus)

    def _admit_prompts(self, g: ChunkedGpu) -> None:
        sim = self.sim
        pending = sum(p.req.meta.prompt_len - p.done for p in g.prefilling)
        while pending < self.budget and sim.sched.num_waiting:
            batch = sim._decide(ClusterView([g.w.stats()], [g.w.stats()]))
            if batch is None:
                return
            # admission only (chunks run inside iterations): report the unchunked estimate
            lengths = [m.prompt_len for m in batch.requests]
            sim.sched.on_batch_done(batch, sim.latency.prefill_time(lengths))
            for meta in batch.requests:
                blocks = blocks_for(meta.prompt_len, g.w.block_size)
                g.w.free_blocks -= blocks
                g.prefilling.append(Prefilling(sim.by_id[meta.request_id], blocks))
                pending += meta.prompt_len

    def _plan(self, g: ChunkedGpu) -> list[tuple[Prefilling, int]]:
        room = max(self.budget - len(g.w.running), 0)
        plan = []
        for p in g.prefilling:
            if room <= 0:
                break
            take = min(room, p.req.meta.prompt_len - p.done)
            plan.append((p, take))
            room -= take
        return plan

    def _iterate(self, g: ChunkedGpu) -> None:
        sim = self.sim
        if g.busy:
            return
        self._admit_prompts(g)
        plan = self._plan(g)
        g.fused.chunks = [(take, p.done) for p, take in plan]
        g.w.admit(sim.now)  # re-admits preempted sequences
        t = g.w.start_step(sim.now)
        if t is not None:
            sim._note_step(g.w)
        elif plan:
            t = g.fused.decode_time(0, 0)
            g.prefill_only_s += t
        else:
            return
        g.busy = True
        sim.push(sim.now + t, self._done, g, plan)

    def _done(self, g: ChunkedGpu, plan: list[tuple[Prefilling, int]]) -> None:
        sim = self.sim
        g.busy = False
        if g.w.busy:
            sim._tokens_out(g.w)
            for seq in g.w.finish_step(sim.now):
                sim._finished(seq.req)
        for p, take in plan:
            p.done += take
            if p.done < p.req.meta.prompt_len:
                continue
            g.prefilling.remove(p)
            p.req.record_token(sim.now)
            if p.req.output_len <= 1:
                p.req.finish_s = sim.now
                g.w.free_blocks += p.blocks
                sim._finished(p.req)
            else:
                g.w.running.append(Seq(p.req, p.req.meta.prompt_len, 1, blocks=p.blocks))
        self._iterate(g)
