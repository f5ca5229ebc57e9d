"""Instance roles of a hybrid deployment, and the slow controller that resets them.

A hybrid instance is a chunked engine with its own prompt-token budget: 0 = decode-only (its
decodes arrive through the KV hand-off), below HEAVY = mixed (Sarathi: prompt chunks beside
its decodes, which stay), HEAVY and above = prefill-heavy (a decode leaves for a decode-only
instance once its TPOT slack runs out, which a long chunk uses up at once).

The controller (TaiChi-style, arXiv 2508.01989; here a ladder of layouts): layout 0 runs every
instance mixed; layout k >= 1 runs k prefill-heavy instances and the rest decode-only (the
DistServe kP(N-k)D split). Every `period_s` it reads the window's attainment: of the TTFT SLO
(requests whose first token came in the window) and of the TPOT SLO (requests that finished).
When one of them is under `target` and the lower of the two, it moves one step:
* TPOT binding: decodes suffer interference (mixed -> split) or too few decode instances
  (split k -> k - 1);
* TTFT binding: too little prefill (split k -> k + 1, and from the largest split back to
  mixed, where every instance prefills).
After a move it holds `hold` periods, then compares the window with the one before the move
and reverts a move that made the worse of the two attainments drop by more than `revert_gap`,
barring that move for `cooldown` periods. Pure Python with the caller's clock: the simulator
and the server run this one class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HEAVY = 1024  # prompt-token budgets from here on are prefill-heavy
SLACK = 0.9  # a decode moves once its mean TPOT would pass this share of its SLO


def out_of_slack(elapsed_s: float, next_step_s: float, num_output: int, tpot_slo_s: float,
                 slack: float = SLACK) -> bool:  # fmt: skip
    """The migration rule of a decode on an instance with a prompt budget: would one more of
    its instance's steps (`next_step_s`, predicted) push its mean TPOT (`elapsed_s` since its
    first token over `num_output` tokens) past `slack` x its TPOT SLO?"""
    return num_output > 0 and (elapsed_s + next_step_s) / num_output > slack * tpot_slo_s


def fixed_budgets(num_instances: int, layout: int, mixed_budget: int,
                  heavy_budget: int) -> tuple[int, ...]:  # fmt: skip
    """Per-instance budgets of a layout: 0 all mixed; k the first k heavy, the rest 0."""
    if layout == 0:
        return (mixed_budget,) * num_instances
    return (heavy_budget,) * layout + (0,) * (num_instances - layout)


@dataclass(slots=True)
class Window:
    """SLO outcomes counted since the last tick."""

    ttft_ok: int = 0
    ttft_n: int = 0
    tpot_ok: int = 0
    tpot_n: int = 0

    def attainment(self) -> tuple[float, float]:
        """(TTFT, TPOT) attainment; 1.0 where nothing was counted."""
        return (self.ttft_ok / self.ttft_n if self.ttft_n else 1.0,
                self.tpot_ok / self.tpot_n if self.tpot_n else 1.0)  # fmt: skip


@dataclass(slots=True)
class RoleController:
    """Chooses the layout (per-instance budgets) of `num_instances` hybrid instances."""

    num_instances: int
    mixed_budget: int = 512
    heavy_budget: int = 2048
    period_s: float = 10.0
    target: float = 0.95  # attainment each SLO should keep
    min_samples: int = 20  # a window with fewer outcomes carries over to the next
    hold: int = 2  # periods after a move before it is judged
    revert_gap: float = 0.05
    cooldown: int = 6  # periods a reverted move stays barred
    layout: int = 0
    changes: int = 0
    window: Window = field(default_factory=Window)
    _next_s: float | None = None
    _held: int = 0
    _before: float | None = None  # worse attainment of the window before the last move
    _undo: int | None = None  # the layout a move left
    _barred: dict[int, int] = field(default_factory=dict)  # layout -> periods left barred

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError(f"num_instances must be >= 1, got {self.num_instances}")
        if not 0 < self.mixed_budget < HEAVY <= self.heavy_budget:
            raise ValueError(f"need 0 < mixed_budget < {HEAVY} <= heavy_budget, got "
                             f"{self.mixed_budget}, {self.heavy_budget}")  # fmt: skip
        if not 0 < self.target <= 1 or self.period_s <= 0:
            raise ValueError(f"target must be in (0, 1] and period_s > 0, got {self.target}, "
                             f"{self.period_s}")  # fmt: skip

    @property
    def num_layouts(self) -> int:
        return self.num_instances  # 0 (all mixed) and splits 1 .. N-1

    def budgets(self, layout: int | None = None) -> tuple[int, ...]:
        """Per-instance prompt-token budgets of a layout (default: the current one)."""
        k = self.layout if layout is None else layout
        return fixed_budgets(self.num_instances, k, self.mixed_budget, self.heavy_budget)

    def record_first_token(self, ok: bool) -> None:
        self.window.ttft_n += 1
        self.window.ttft_ok += ok

    def record_finish(self, ok: bool) -> None:
        self.window.tpot_n += 1
        self.window.tpot_ok += ok

    def tick(self, now: float) -> tuple[int, ...] | None:
        """Call often; every period_s it may move: the new budgets, or None (no change)."""
        if self._next_s is None:
            self._next_s = now + self.period_s
        if now < self._next_s:
            return None
        self._next_s = now + self.period_s
        w = self.window
        if w.ttft_n + w.tpot_n < self.min_samples:
            return None
        self.window = Window()
        self._barred = {k: n - 1 for k, n in self._barred.items() if n > 1}
        new = self._decide(*w.attainment())
        if new is None or new == self.layout:
            return None
        self.layout, self.changes = new, self.changes + 1
        return self.budgets()

    def _decide(self, ttft: float, tpot: float) -> int | None:
        worse = min(ttft, tpot)
        if self._held:
            self._held -= 1
            if self._held == 0 and self._before is not None:
                if worse < self._before - self.revert_gap:  # the move hurt: undo it
                    self._barred[self.layout] = self.cooldown
                    undo, self._before = self._undo, None
                    return undo
                self._before = None
            return None
        if worse >= self.target:
            return None
        step = self._step(tpot_binding=tpot < ttft)
        if step is None or step in self._barred:
            return None
        self._before, self._undo, self._held = worse, self.layout, self.hold
        return step

    def _step(self, tpot_binding: bool) -> int | None:
        k, n = self.layout, self.num_instances
        if n < 2:
            return None
        if tpot_binding:
            return (n + 1) // 2 if k == 0 else (k - 1 if k > 1 else None)
        if k == 0:
            return None  # every instance already prefills
        return k + 1 if k < n - 1 else 0
