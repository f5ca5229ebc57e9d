"""SCLS slice-level serving (see scheduling/scls.py for the policy): each instance runs one
slice batch at a time, static-batch style (finished sequences keep their slot until the slice
ends); after the slice the unfinished are re-queued with prompt + generated tokens and their
KV dropped, to be prefilled again in a later slice.

Max-min balancing: a new slice batch goes to the idle instance with the least work assigned
so far (SCLS's offloader balances estimated completion times; with one shared queue and
dispatch on idle, that is the only choice left to make).
"""

from __future__ import annotations

from bucketserve.scheduling import ClusterView, InstanceStats, PrefillBatch, RequestMeta
from bucketserve.sim.workload import SimRequest


class SclsGpu:
    def __init__(self, name: str, cluster) -> None:
        self.name, self.cluster = name, cluster
        self.busy = False
        self.busy_s = 0.0

    def stats(self) -> InstanceStats:
        c = self.cluster
        free = 0 if self.busy else c.kv_blocks  # KV lives for one slice only
        return InstanceStats(self.name, "mixed", c.kv_blocks, free, c.block_size,
                             0, 0.0, c.kv_bytes_per_token)  # fmt: skip


class SclsEngine:
    """Event handlers of the slice-level deployment, driven by the Simulator."""

    def __init__(self, sim) -> None:
        self.sim, c = sim, sim.cluster
        self.gpus = [SclsGpu(f"gpu{i}", c) for i in range(c.num_aggregated)]
        self.workers: list = []
        self.generated: dict[str, int] = {}

    def on_arrival(self) -> None:
        for g in sorted((g for g in self.gpus if not g.busy), key=lambda g: g.busy_s):
            self._try_slice(g)

    def busy_s(self) -> float:
        return sum(g.busy_s for g in self.gpus)

    def _try_slice(self, g: SclsGpu) -> None:
        sim = self.sim
        if g.busy or not sim.sched.num_waiting:
            return
        batch = sim._decide(ClusterView([g.stats()], [g.stats()]))
        if batch is None:
            return
        reqs = [sim.by_id[m.request_id] for m in batch.requests]
        prefill_s, total_s = self._run_slice(batch, reqs)
        g.busy = True
        g.busy_s += total_s
        sim.push(sim.now + total_s, self._slice_done, g, batch, reqs, prefill_s)

    def _run_slice(self, batch: PrefillBatch, reqs: list[SimRequest]) -> tuple[float, float]:
        """Lay out one slice: prefill of every context, then up to slice - 1 decode steps."""
        sim, lat = self.sim, self.sim.latency
        contexts = [m.prompt_len for m in batch.requests]
        prefill = lat.prefill_time(contexts, sim.cluster.padded_prefill)
        t, n, longest = sim.now + prefill, len(reqs), max(contexts)
        for r in reqs:
            r.record_token(t)
        left = {r.meta.request_id: self._remaining(r) - 1 for r in reqs}
        steps = 0
        for k in range(1, sim.sched.config.scls_slice_tokens):
            active = [r for r in reqs if left[r.meta.request_id] > 0]
            if not active:
                break
            t += lat.decode_time(n, n * (longest + k))
            steps += 1
            for r in active:
                r.record_token(t)
                left[r.meta.request_id] -= 1
        if steps:
            step = (t - sim.now - prefill) / steps
            sim.sched.observe_step(n, longest + steps // 2, step)
        return prefill, t - sim.now

    def _remaining(self, r: SimRequest) -> int:
        return r.output_len - self.generated.get(r.meta.request_id, 0)

    def _slice_done(self, g: SclsGpu, batch: PrefillBatch, reqs: list[SimRequest], prefill_s):
        sim, s = self.sim, self.sim.sched.config.scls_slice_tokens
        g.busy = False
        sim.sched.on_batch_done(batch, prefill_s)
        for r, meta in zip(reqs, batch.requests, strict=True):
            rid = meta.request_id
            if self._remaining(r) <= s:
                r.finish_s = r.last_token_s
                sim._finished(r)
                continue
            self.generated[rid] = self.generated.get(rid, 0) + s
            sim.sched.on_request_finished(rid)  # the slice's reservation ends with its KV
            sim.sched.add(_requeued(r.meta, self.generated[rid]))
        self.on_arrival()


def _requeued(meta: RequestMeta, generated: int) -> RequestMeta:
    """The same request, to be prefilled again with what it has generated so far."""
    return RequestMeta(meta.request_id, meta.prompt_len + generated, meta.max_tokens - generated,
                       meta.arrival_s, meta.slo_class, meta.ttft_slo_s, meta.tpot_slo_s,
                       meta.task_type)  # fmt: skip
