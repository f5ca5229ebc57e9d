"""Colocated continuous batching on the engine Scheduler: Sarathi-style chunked prefill, and
the vLLM-like aggregated instance.

Chunked: every iteration fuses one decode token for each running sequence with up to
(chunk_tokens - decodes) prompt tokens, so a long prompt never stalls decode for more than one
bounded iteration; the fused iteration is charged `latency.hybrid_time` (weights read once).
Aggregated (vLLM v0-like): prompts are prefilled whole, and an iteration that carries prompt
tokens runs them alone (decode pauses), charged `prefill_time`; the others are decode steps.

Prompts reach an instance through the policy's `next_batch` (its order and admission) and
queue in that instance's Scheduler, which admits, chunks, preempts and stops them.
"""

from __future__ import annotations

from bucketserve.engine.scheduler import ScheduledStep
from bucketserve.scheduling import ClusterView
from bucketserve.sim.instance import (
    NO_CHUNKS,
    SimInstance,
    chunk_list,
    pending_prompt_tokens,
    step_context,
)


class ChunkedEngine:
    """Event handlers of the chunked-prefill deployment, driven by the Simulator."""

    def __init__(self, sim, budget: int | None = None) -> None:
        self.sim, c = sim, sim.cluster
        self.budget = c.chunk_tokens if budget is None else budget
        self.workers = [SimInstance(f"gpu{i}", "mixed", c, self.budget)
                        for i in range(c.num_aggregated)]  # fmt: skip

    def on_arrival(self) -> None:
        if self.sim.router is not None:
            self._place()
        for w in self.workers:
            self._iterate(w)

    def busy_s(self) -> float:
        return sum(w.busy_s for w in self.workers)

    def _intake(self, w: SimInstance) -> int:
        """Queue prompts while less than this many prompt tokens wait on `w`."""
        return self.budget

    def _admit_prompts(self, w: SimInstance) -> None:
        sim = self.sim
        pending = pending_prompt_tokens(w)
        while pending < self._intake(w) and sim.sched.num_waiting:
            batch = sim._decide(ClusterView([w.stats()], [w.stats()]))
            if batch is None:
                return
            # admission only (the Scheduler runs the prompts): report the unchunked estimate
            lengths = [m.prompt_len for m in batch.requests]
            sim.sched.on_batch_done(batch, sim.latency.prefill_time(lengths))
            for meta in batch.requests:
                w.add_prompt(sim.by_id[meta.request_id])
                pending += meta.prompt_len

    def _place(self) -> None:
        """The server's colocated placement (sim.router): offer the instances whose intake is
        open, in the router's order, each alone to the policy, until nothing more is placed."""
        sim, by_id = self.sim, {w.instance_id: w for w in self.workers}
        while sim.sched.num_waiting:
            stats = [w.stats() for w in self.workers]
            for s in sim.router.offer(stats, lambda s: s.prefill_backlog < self.budget):
                batch = sim._decide(ClusterView([s], [s]))
                if batch is not None:
                    break
            else:
                return
            w = by_id[s.instance_id]
            lengths = [m.bucket_len for m in batch.requests]
            sim.sched.on_batch_done(batch, sim.latency.prefill_time(lengths))
            for meta in batch.requests:
                req = sim.by_id[meta.request_id]
                sim.router.place(w.instance_id, req)
                w.add_prompt(req)

    def _cost(self, step: ScheduledStep) -> float:
        return self.sim.latency.hybrid_time(len(step.decodes), step_context(step),
                                            chunk_list(step))  # fmt: skip

    def _schedule(self, w: SimInstance) -> ScheduledStep:
        return w.schedule(self.sim.now)

    def _iterate(self, w: SimInstance) -> None:
        sim = self.sim
        if w.busy:
            return
        if sim.router is None:
            self._admit_prompts(w)
        step = self._schedule(w)
        if step.is_empty:
            return
        t = self._cost(step)
        w.start(t)
        sim.push(sim.now + t, self._done, w, step)

    def _done(self, w: SimInstance, step: ScheduledStep) -> None:
        for req in w.finish(step, self.sim.now):
            self.sim._finished(req)
        if self.sim.router is None:
            self._iterate(w)
            return
        self._place()  # intake reopened here; the prompts may go to any instance
        for x in self.workers:
            self._iterate(x)


class AggregatedEngine(ChunkedEngine):
    """vLLM v0-like instances: whole prompts, one policy batch at a time, and an iteration
    with prompt tokens carries no decodes (prefill first, decode paused)."""

    def __init__(self, sim) -> None:
        super().__init__(sim, NO_CHUNKS)

    def _intake(self, w: SimInstance) -> int:
        return 1  # a new batch only once the last one is admitted

    def _schedule(self, w: SimInstance) -> ScheduledStep:
        step = w.schedule(self.sim.now)
        if step.chunks:
            step.decodes.clear()  # they keep their slot and run in the next decode step
        return step

    def _cost(self, step: ScheduledStep) -> float:
        lat = self.sim.latency
        if step.chunks:
            lengths = [c.num_tokens for c in step.chunks]
            return lat.prefill_time(lengths, self.sim.cluster.padded_prefill)
        return lat.decode_time(len(step.decodes), step_context(step))
