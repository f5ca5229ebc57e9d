"""Hybrid instances (static slider, TaiChi-style; arXiv 2508.01989): every instance runs fused
chunked iterations on the engine Scheduler with its own prompt-token budget.

* budget 0: decode-only. It takes no prompts; decodes reach it through the KV hand-off.
* budget < HEAVY: mixed (Sarathi): prompts are chunked beside the decodes, which stay.
* budget >= HEAVY: prefill-heavy. A prompt's decode leaves for a decode-only instance once
  its first token is out (when one exists), so long chunks never stretch those decodes' TBT.

Routing: prompts are pulled by the instances with budget to spare (an instance takes a policy
batch while its queued prompt tokens are below its budget, so a prompt goes where it waits at
most about one iteration: the least predicted TTFT); a migrating decode goes to the
decode-only instance whose next step the latency model predicts fastest with it added (the
most TPOT slack). Budgets are fixed per run; the slow controller that re-sets them from
measured attainment is not built yet.
"""

from __future__ import annotations

from bucketserve.engine.scheduler import ScheduledStep
from bucketserve.sim.chunked import ChunkedEngine
from bucketserve.sim.instance import SimInstance

HEAVY = 1024  # prompt-token budgets from here on are prefill-heavy
RECOMPUTE_BUDGET = 512  # a decode-only instance still recomputes its preempted sequences


class _Moved:
    """The source of a migrated decode: its blocks were freed when it left."""

    @staticmethod
    def release(prompt_len: int) -> None:
        pass


class HybridEngine(ChunkedEngine):
    """Event handlers of the hybrid deployment, driven by the Simulator."""

    def __init__(self, sim) -> None:
        self.sim, c = sim, sim.cluster
        self.budgets = c.chunk_budgets or (c.chunk_tokens,) * c.num_aggregated
        lat = sim.latency
        self.workers = [
            SimInstance(f"gpu{i}", "mixed" if b else "decode", c, b or RECOMPUTE_BUDGET,
                        handoff_time=None if b else lat.handoff_time)
            for i, b in enumerate(self.budgets)
        ]  # fmt: skip
        self.budget_of = {w.instance_id: b for w, b in zip(self.workers, self.budgets, strict=True)}
        self.decode_only = [w for w in self.workers if not self.budget_of[w.instance_id]]
        self.migrations = 0

    def _intake(self, w: SimInstance) -> int:
        return self.budget_of[w.instance_id]

    def _iterate(self, w: SimInstance) -> None:
        sim = self.sim
        if w.busy:
            return
        self._admit_prompts(w)
        step = w.schedule(sim.now)
        if step.is_empty:
            if (ready := w.next_ready_s()) is not None:
                sim.push(ready, self._iterate, w)
            return
        t = self._cost(step)
        w.start(t)
        sim.push(sim.now + t, self._done, w, step)

    def _done(self, w: SimInstance, step: ScheduledStep) -> None:
        firsts = [c.seq for c in step.chunks if c.is_last and not c.seq.num_completion_tokens]
        for req in w.finish(step, self.sim.now):
            self.sim._finished(req)
        if self.decode_only and self.budget_of[w.instance_id] >= HEAVY:
            for seq in firsts:
                if not seq.is_finished:
                    self._migrate(w, seq)
        self._iterate(w)

    def _migrate(self, src: SimInstance, seq) -> None:
        """Move a decode to the decode-only instance with the most TPOT slack."""
        req = src.reqs.pop(seq.seq_id)
        src.scheduler.finish(seq, "migrated")  # its blocks are free here; its KV moves
        dst = min(self.decode_only, key=lambda d: self._predicted_step(d, seq.num_tokens))
        dst.add_prefilled(req, source=_Moved())
        self.migrations += 1
        self._iterate(dst)

    def _predicted_step(self, w: SimInstance, tokens: int) -> float:
        decodes = [s for s in w.running if s.num_uncomputed_tokens == 1]
        context = sum(s.num_computed_tokens for s in decodes) + tokens
        waiting = len(w.scheduler.waiting)
        return self.sim.latency.decode_time(len(decodes) + waiting + 1, context)
