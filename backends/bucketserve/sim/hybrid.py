"""Hybrid instances (TaiChi-style; arXiv 2508.01989): every instance runs fused chunked
iterations on the engine Scheduler with its own prompt-token budget (scheduling.roles):

* budget 0: decode-only. It takes no prompts; decodes reach it through the KV hand-off.
* budget < HEAVY: mixed (Sarathi): prompts are chunked beside the decodes.
* budget >= HEAVY: prefill-heavy.

Routing: prompts are pulled by the instances with budget to spare (an instance takes a policy
batch while its queued prompt tokens are below its budget, so a prompt goes where it waits at
most about one iteration: the least predicted TTFT). A decode on an instance with a budget
moves, through the KV hand-off, to the decode-only instance whose next step the latency model
predicts fastest with it added (the most TPOT slack) once its own TPOT slack runs out: its
mean TPOT with this instance's next predicted step (its decodes plus the prompt chunk its
budget lets in) would pass SLACK x its TPOT SLO. A decode that waits on a prefill-heavy
instance with prompts queued leaves; one on an idle instance stays.

Budgets are fixed per run (`chunk_budgets`), or, with `adaptive_roles`, reset by the slow
controller (`scheduling.roles.RoleController`) from the attainment it measures every 10 s.
"""

from __future__ import annotations

from bucketserve.engine.scheduler import ScheduledStep
from bucketserve.scheduling.roles import HEAVY, RoleController, out_of_slack
from bucketserve.sim.chunked import ChunkedEngine
from bucketserve.sim.instance import SimInstance, pending_prompt_tokens
from bucketserve.sim.metrics import tpot

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
        self.controller = None
        if c.adaptive_roles:
            self.controller = RoleController(c.num_aggregated, mixed_budget=c.chunk_tokens)
        budgets = (self.controller.budgets() if self.controller else
                   c.chunk_budgets or (c.chunk_tokens,) * c.num_aggregated)  # fmt: skip
        # every instance may become decode-only under the controller: all accept hand-offs
        self.workers = [SimInstance(f"gpu{i}", "mixed", c, handoff_time=sim.latency.handoff_time)
                        for i in range(len(budgets))]  # fmt: skip
        self.budget_of: dict[str, int] = {}
        self.decode_only: list[SimInstance] = []
        self._apply(budgets)
        self.migrations = 0
        self.layouts: list[tuple[float, tuple[int, ...]]] = [(0.0, budgets)]

    def _apply(self, budgets: tuple[int, ...]) -> None:
        """Give each instance its budget and the role that goes with it."""
        for w, b in zip(self.workers, budgets, strict=True):
            self.budget_of[w.instance_id] = b
            w.role = "decode" if b == 0 else ("prefill" if b >= HEAVY else "mixed")
            w.scheduler.set_token_budget(b or RECOMPUTE_BUDGET)
        self.decode_only = [w for w in self.workers if not self.budget_of[w.instance_id]]

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
            self._observe_finish(req)
            self.sim._finished(req)
        for seq in firsts:
            self._observe_first(self.sim.by_id[seq.seq_id])
        if self.decode_only and self.budget_of[w.instance_id]:
            next_s = self._next_step(w)
            for seq in [s for s in w.running if s.num_uncomputed_tokens == 1]:
                if self._out_of_slack(w, seq, next_s):
                    self._migrate(w, seq)
        self._control()
        self._iterate(w)

    def _next_step(self, w: SimInstance) -> float:
        """Predicted time of w's next iteration: its decodes plus the prompt chunk its budget
        lets in (a prefill-heavy instance with prompts queued: a long step)."""
        decodes = [s for s in w.running if s.num_uncomputed_tokens == 1]
        chunk = min(self.budget_of[w.instance_id] - len(decodes), pending_prompt_tokens(w))
        context = sum(s.num_computed_tokens for s in decodes)
        return self.sim.latency.hybrid_time(
            len(decodes), context, [(chunk, 0)] if chunk > 0 else []
        )

    def _out_of_slack(self, w: SimInstance, seq, next_s: float) -> bool:
        """Would one more of w's steps push the decode's mean TPOT past SLACK x its SLO?"""
        req = w.reqs[seq.seq_id]
        done = seq.num_completion_tokens
        if w.ready_s.get(seq.seq_id) is not None:
            return False
        return out_of_slack(self.sim.now - req.first_token_s, next_s, done, req.meta.tpot_slo_s)

    def _migrate(self, src: SimInstance, seq) -> None:
        """Move a decode to the decode-only instance with the most TPOT slack."""
        req = src.reqs.pop(seq.seq_id)
        src.scheduler.finish(seq, "migrated")  # its blocks are free here; its KV moves
        dst = min(self.decode_only, key=lambda d: self._predicted_step(d, seq.num_tokens))
        dst.add_prefilled(req, source=_Moved(), num_output=seq.num_completion_tokens)
        self.migrations += 1
        self._iterate(dst)

    def _predicted_step(self, w: SimInstance, tokens: int) -> float:
        decodes = [s for s in w.running if s.num_uncomputed_tokens == 1]
        context = sum(s.num_computed_tokens for s in decodes) + tokens
        waiting = len(w.scheduler.waiting)
        return self.sim.latency.decode_time(len(decodes) + waiting + 1, context)

    # ---- the slow controller ---------------------------------------------------------------
    def _observe_first(self, req) -> None:
        if self.controller is not None:
            ttft = req.first_token_s - req.meta.arrival_s
            self.controller.record_first_token(ttft <= req.meta.ttft_slo_s)

    def _observe_finish(self, req) -> None:
        if self.controller is not None:
            self.controller.record_finish(tpot(req) <= req.meta.tpot_slo_s)

    def _control(self) -> None:
        if self.controller is None:
            return
        budgets = self.controller.tick(self.sim.now)
        if budgets is not None:
            self._apply(budgets)
            self.layouts.append((self.sim.now, budgets))
            for x in self.workers:
                self._iterate(x)
