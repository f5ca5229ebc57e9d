"""Bullet-like colocated serving: prefill and decode run at the same time on one GPU, each on
its own share of the SMs, over one shared KV pool (no hand-off).

SLO-aware partitioning (Bullet's Algorithm 1, step 4, simplified): while a prefill runs,
decode gets the fewest SMs whose step still meets `bullet_tpot_share` (0.5) x its TPOT SLO; prefill gets
the rest, fixed for the batch (Bullet re-decides between layer groups; we decide per batch).
With no prefill running decode gets every SM, and with no decode prefill does. The queue
order and batch rule are the "bullet" policy's (scheduling/orderings.py).

The prefill stream is the simulator's own (it takes its prompt blocks from the GPU's pool
while it runs); the decodes go through the engine Scheduler, which admits each prefilled
sequence with its KV already computed, grows, preempts (recompute, on the decode SMs) and
stops them.
"""

from __future__ import annotations

from bucketserve.engine.scheduler import ScheduledStep
from bucketserve.scheduling import ClusterView, PrefillBatch
from bucketserve.sim.instance import SimInstance, step_context
from bucketserve.sim.sm_latency import SmPartitionLatency
from bucketserve.sim.workload import SimRequest


class BulletGpu:
    """One GPU: a Scheduler-driven decode instance and a prefill stream sharing SMs and KV."""

    def __init__(self, name: str, cluster, srm: SmPartitionLatency, tpot_target_s: float):
        self.srm, self.tpot_target_s = srm, tpot_target_s
        self.prefill_busy = False
        self.prefill_busy_s = 0.0
        self.w = SimInstance(name, "mixed", cluster)

    def _decode_load(self) -> tuple[int, int]:
        decodes = [s for s in self.w.running if s.num_uncomputed_tokens == 1]
        return len(decodes), sum(s.num_computed_tokens for s in decodes)

    def decode_sms(self, batch: int, context_tokens: int) -> int:
        if not self.prefill_busy:
            return self.srm.gpu.sms
        return self.srm.min_decode_sms(batch, context_tokens, self.tpot_target_s)

    def prefill_sms(self) -> int:
        batch, context = self._decode_load()
        if not batch:
            return self.srm.gpu.sms
        need = self.srm.min_decode_sms(batch, context, self.tpot_target_s)
        return max(self.srm.gpu.sms - need, 2)

    def step_time(self, step: ScheduledStep) -> float:
        """A decode step on decode's SMs, plus any recompute chunks (after a preemption) run
        there as a prefill."""
        n, context = len(step.decodes), step_context(step)
        t = 0.0
        if n:
            t = self.srm.decode_time(n, context, self.decode_sms(n, context),
                                     corun=self.prefill_busy)  # fmt: skip
        if step.chunks:
            lengths = [c.num_tokens for c in step.chunks]
            t += self.srm.prefill_time(lengths, False, self.decode_sms(1, 0), corun=True)
        return t


class BulletEngine:
    """Event handlers of the colocated SM-sharing deployment, driven by the Simulator."""

    def __init__(self, sim) -> None:
        self.sim = sim
        c = sim.cluster
        srm = SmPartitionLatency(sim.latency)
        target = c.bullet_tpot_share * min(r.meta.tpot_slo_s for r in sim.requests)
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
        blocks = g.w.blocks
        held = blocks.allocate(sum(blocks.blocks_needed(n) for n in lengths))
        g.prefill_busy = True
        g.prefill_busy_s += t
        sim.push(sim.now + t, self._prefill_done, g, batch, reqs, t, held)

    def _prefill_done(self, g: BulletGpu, batch: PrefillBatch, reqs: list[SimRequest],
                      t: float, held: list[int]) -> None:  # fmt: skip
        sim = self.sim
        g.prefill_busy = False
        sim.sched.on_batch_done(batch, t)
        g.w.blocks.free(held)  # the prompts' KV now belongs to their decode sequences
        for r in reqs:
            r.record_token(sim.now)
            if r.output_len <= 1:
                r.finish_s = sim.now
                sim._finished(r)
            else:
                g.w.add_prefilled(r)
        self._try_decode(g)
        self._try_prefill(g)

    def _try_decode(self, g: BulletGpu) -> None:
        sim = self.sim
        if g.w.busy:
            return
        step = g.w.schedule(sim.now)
        if step.is_empty:
            return
        t = g.step_time(step)
        g.w.start(t)
        sim.push(sim.now + t, self._step_done, g, step)

    def _step_done(self, g: BulletGpu, step: ScheduledStep) -> None:
        sim = self.sim
        for req in g.w.finish(step, sim.now):
            sim._finished(req)
        self._try_decode(g)
        self._try_prefill(g)
