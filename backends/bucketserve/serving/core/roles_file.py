"""The hybrid topology's per-instance budgets: the scheduler writes them, the instances read.

The scheduler's RoleController (scheduling/roles.py) chooses a layout; `RolesFile.write` puts
the budgets of every instance in `<run-dir>/kv/roles.json` (whole, then renamed) and each
engine instance polls the file's mtime a few times a second (`RolesReader`). Before the
scheduler has written anything, or for a file of another run, an instance takes the layout
its configuration starts with (`initial_budgets`), so no start order matters.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bucketserve.scheduling.roles import RoleController, fixed_budgets
from bucketserve.serving.config import ServeConfig

POLL_S = 0.1


def roles_path(cfg: ServeConfig) -> Path:
    return cfg.run_path / "kv" / "roles.json"


def initial_budgets(cfg: ServeConfig) -> tuple[int, ...]:
    """The layout a run starts with: the fixed one, or (adaptive) every instance mixed."""
    return fixed_budgets(len(cfg.decode_devices), max(cfg.hybrid_layout, 0),
                         cfg.iteration_tokens, cfg.hybrid_heavy_tokens)  # fmt: skip


def write_budgets(cfg: ServeConfig, budgets: tuple[int, ...], layout: int) -> None:
    path = roles_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"run_id": cfg.run_id, "layout": layout, "budgets": list(budgets)}))
    tmp.replace(path)


class RolesReader:
    """An instance's view of the budgets; `budgets()` is cheap (one stat per POLL_S)."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg, self.path = cfg, roles_path(cfg)
        self.current = initial_budgets(cfg)
        self._mtime, self._next = -1, 0.0

    def budgets(self) -> tuple[int, ...]:
        now = time.monotonic()
        if now < self._next:
            return self.current
        self._next = now + POLL_S
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime != self._mtime:
                doc = json.loads(self.path.read_text())
                self._mtime = mtime
                if doc.get("run_id") == self.cfg.run_id and len(doc["budgets"]) == len(
                    self.current
                ):
                    self.current = tuple(int(b) for b in doc["budgets"])
        except (OSError, ValueError, KeyError, TypeError):  # not written yet, or mid-rename
            pass
        return self.current


class HybridControl:
    """The scheduler's side: the budgets it offers prompts by, the controller that moves them
    (adaptive) and the file the instances read. Not thread-safe: the scheduler calls it under
    its lock."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.budgets = initial_budgets(cfg)
        self.controller = None
        if cfg.hybrid_layout < 0:
            self.controller = RoleController(
                len(cfg.decode_devices), mixed_budget=cfg.iteration_tokens,
                heavy_budget=cfg.hybrid_heavy_tokens, period_s=cfg.hybrid_period_s,
            )  # fmt: skip
        self.layout = max(cfg.hybrid_layout, 0)
        self.changes = self.moved = 0
        write_budgets(cfg, self.budgets, self.layout)

    def budget(self, index: int) -> int:
        return self.budgets[index]

    def record(self, slo_met: tuple[bool, bool]) -> None:
        if self.controller is not None:
            self.controller.record_first_token(slo_met[0])
            self.controller.record_finish(slo_met[1])

    def tick(self, now: float) -> bool:
        """Let the controller look (every period); True when the budgets changed."""
        if self.controller is None:
            return False
        budgets = self.controller.tick(now)
        if budgets is None:
            return False
        self.budgets, self.layout = budgets, self.controller.layout
        self.changes += 1
        write_budgets(self.cfg, budgets, self.layout)
        return True
