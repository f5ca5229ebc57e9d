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
from bucketserve.sim.instance import NO_CHUNKS, SimInstance, chunk_list, step_context


def pending_prompt_tokens(inst: SimInstance) -> int:
    """Prompt (or recompute) tokens queued or mid-prefill on `inst`."""
    seqs = (*inst.scheduler.running, *inst.scheduler.waiting)
    return sum(s.num_uncomputed_tokens for s in seqs if s.num_uncomputed_tokens > 1)


class ChunkedEngine:
    """Event handlers of the chunked-prefill deployment, driven by the Simulator."""

    def __init__(self, sim, budget: int | None = None) -> None:
        self.sim, c = sim, sim.cluster
        self.budget = c.chunk_tokens if budget is None else budget
        self.workers = [SimInstance(f"gpu{i}", "mixed", c, self.budget)
                        for i in range(c.num_aggregated)]  # fmt: skip

    def on_arrival(self) -> None:
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

    def _cost(self, step: ScheduledStep) -> float:
        return self.sim.latency.hybrid_time(len(step.decodes), step_context(step),
                                            chunk_list(step))  # fmt: skip

    def _schedule(self, w: SimInstance) -> ScheduledStep:
        return w.schedule(self.sim.now)

    def _iterate(self, w: SimInstance) -> None:
        sim = self.sim
        if w.busy:
            return
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
        self._iterate(w)


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
