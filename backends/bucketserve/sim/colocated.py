"""Bullet-like colocated serving: prefill and decode run at the same time on one GPU, each on
its own share of the SMs, over one shared KV pool (no hand-off).

SLO-aware partitioning (Bullet's Algorithm 1, step 4, simplified): while a prefill runs,
decode gets the fewest SMs whose step still meets `tpot_share` x its TPOT SLO; prefill gets
the rest, fixed for the batch (Bullet re-decides between layer groups; we decide per batch).
With no prefill running decode gets every SM, and with no decode prefill does. The queue
order and batch rule are the "bullet" policy's (scheduling/orderings.py).
"""

from __future__ import annotations

from bucketserve.scheduling import ClusterView, PrefillBatch
from bucketserve.scheduling.memory import blocks_for
from bucketserve.sim.decode_worker import DecodeWorker, Seq
from bucketserve.sim.sm_latency import SmPartitionLatency
from bucketserve.sim.workload import SimRequest


class _DecodeShare:
    """The latency the DecodeWorker sees: SRM on the SMs its GPU's partition gives decode."""

    def __init__(self, gpu: BulletGpu) -> None:
        self.gpu = gpu

    def decode_time(self, batch: int, context_tokens: int) -> float:
        g = self.gpu
        return g.srm.decode_time(batch, context_tokens, g.decode_sms(batch, context_tokens),
                                 corun=g.prefill_busy)  # fmt: skip

    def prefill_time(self, lengths, padded: bool = False) -> float:  # recompute after preemption
        return self.gpu.srm.prefill_time(lengths, padded, self.gpu.decode_sms(1, 0), corun=True)

    def handoff_time(self, tokens: int) -> float:
        return 0.0


class BulletGpu:
    """One GPU: a decode worker and a prefill stream sharing SMs and the KV pool."""

    def __init__(self, name: str, cluster, srm: SmPartitionLatency, tpot_target_s: float):
        self.srm, self.tpot_target_s = srm, tpot_target_s
        self.prefill_busy = False
        self.prefill_busy_s = 0.0
        self.w = DecodeWorker(name, "mixed", cluster.kv_blocks, cluster.block_size,
                              cluster.max_num_seqs, _DecodeShare(self), cluster.kv_bytes_per_token)  # fmt: skip

    def decode_sms(self, batch: int, context_tokens: int) -> int:
        if not self.prefill_busy:
            return self.srm.gpu.sms
        return self.srm.min_decode_sms(batch, context_tokens, self.tpot_target_s)

    def prefill_sms(self) -> int:
        ready = [s for s in self.w.running if not s.recompute]
        if not ready:
            return self.srm.gpu.sms
        need = self.srm.min_decode_sms(
            len(ready), sum(s.context for s in ready), self.tpot_target_s
        )
        return max(self.srm.gpu.sms - need, 2)


class BulletEngine:
    """Event handlers of the colocated SM-sharing deployment, driven by the Simulator."""

    def __init__(self, sim, tpot_share: float = 0.5) -> None:
        self.sim = sim
        c = sim.cluster
        srm = SmPartitionLatency(sim.latency)
        target = tpot_share * min(r.meta.tpot_slo_s for r in sim.requests)
        self.gpus = [BulletGpu(f"gpu{i}", c, srm, target) for i in range(c.num_aggregated)]
        self.workers = [g.w for g in self.gpus]

    def on_arrival(self) -> None:
        for g in self.gpus:
            self._try_prefill(g)

    def busy_s(self) -> float:
        return sum(g.prefill_busy_s + g.w.busy_s for g in self.gpus)

    def _try_prefill(self, g: BulletGpu) -> None:
        sim = self.sim
        if g.prefill_busy or not sim.sched.num_waiting:
            return
        batch = sim._decide(ClusterView([g.w.stats()], [g.w.stats()]))
        if batch is None:
            return
        reqs = [sim.by_id[m.request_id] for m in batch.requests]
        lengths = [r.meta.prompt_len for r in reqs]
        sms, corun = g.prefill_sms(), bool(g.w.running)
        t = g.srm.prefill_time(lengths, sim.cluster.padded_prefill, sms, corun)
        for length in lengths:
            g.w.free_blocks -= blocks_for(length, g.w.block_size)
        g.prefill_busy = True
        g.prefill_busy_s += t
        sim.push(sim.now + t, self._prefill_done, g, batch, reqs, t)

    def _prefill_done(self, g: BulletGpu, batch: PrefillBatch, reqs: list[SimRequest], t: float):
        sim = self.sim
        g.prefill_busy = False
        sim.sched.on_batch_done(batch, t)
        for r in reqs:
            r.record_token(sim.now)
            blocks = blocks_for(r.meta.prompt_len, g.w.block_size)
            if r.output_len <= 1:
                r.finish_s = sim.now
                g.w.free_blocks += blocks
                sim._finished(r)
            else:
                g.w.running.append(Seq(r, r.meta.prompt_len, 1, blocks=blocks))
        self._try_decode(g)
        self._try_prefill(g)

    def _try_decode(self, g: BulletGpu) -> None:
        sim = self.sim
        if g.w.busy:
            return
        g.w.admit(sim.now)  # re-admits preempted sequences
        t = g.w.start_step(sim.now)
        if t is not None:
            sim._note_step(g.w)
            sim.push(sim.now + t, self._step_done, g)

    def _step_done(self, g: BulletGpu) -> None:
        sim = self.sim
        sim._tokens_out(g.w)
        for seq in g.w.finish_step(sim.now):
            sim._finished(seq.req)
        self._try_decode(g)
        self._try_prefill(g)
