"""The kill test: adaptive hybrid instances against the best static configuration, per cell.

    python -m bucketserve.sim.killtest --seeds 3 --out perf/results/sim/killtest \\
        --doc docs/scheduling.md

Cells as in sim/grid.py (TPOT {40, 60, 100 ms} x TTFT scale {0.5, 1, 2} x {Mixed, Alpaca,
phased}). Static candidates: the configurations that won a cell of the seed-0 grid plus
Sarathi TP2 512 (every one SLO-blind: one run per rate, judged in all nine cells). The hybrid
(`scheduling.roles.RoleController` over two TP2 instances, sim/hybrid.py) reads the cell's
SLOs, so it runs once per cell. Each (system, cell, seed) goodput@90 comes from a bisection
over the grid's rate list (monotone attainment assumed; every probed rate is kept in
rows.csv), steady-state rules as in the grid (sim/steady.py). The ratio per cell is the
hybrid's goodput over the best static configuration's (chosen by its mean over seeds),
paired by seed (same requests), mean and 95 % CI over seeds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bucketserve.sim.grid import (
    HY,
    RATES,
    SYSTEMS,
    TARGET,
    TP2_AGG,
    TPOTS,
    TTFT_SCALES,
    WORKLOADS,
    GridSystem,
    add_run_args,
    goodput,
    run_cells,
    run_pool,
    run_resumable,
)

STATIC = ("sarathi TP2 512", "distserve TP2 1P1D", "distserve 1P3D", "sarathi 256")
HYBRID = GridSystem("hybrid adaptive TP2", "hybrid", "fcfs",
                    HY | TP2_AGG | {"adaptive_roles": True}, 2, True)  # fmt: skip
# Alpaca requests live ~4 s: 300 s is ~75 lifetimes (the grid's 60 s runs failed every
# system at 48 req/s on warm-up growth of the in-flight count, not on a queue)
DURATION = {"mixed": 600.0, "alpaca": 300.0, "phased": 600.0}
Cell = tuple[float, float]


def _system(label: str) -> GridSystem:
    return HYBRID if label == HYBRID.label else next(s for s in SYSTEMS if s.label == label)


def bisect_sweep(probe, rates, cells: list[Cell]) -> list[dict]:
    """Rows of the rates a bisection per cell probes (probe(rate) -> rows of every cell,
    memoised): enough for goodput() to find each cell's last passing rate and first miss."""
    seen: dict[float, list[dict]] = {}

    def eff(i: int, cell: Cell) -> float:
        if rates[i] not in seen:
            seen[rates[i]] = probe(rates[i])
        row = next(r for r in seen[rates[i]] if (r["tpot_s"], r["ttft_scale"]) == cell)
        return row["effective"]

    for cell in cells:
        lo, hi = -1, len(rates)  # eff(lo) >= TARGET (or none), eff(hi) < TARGET (or none)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if eff(mid, cell) >= TARGET else (lo, mid)
        for i in (lo - 1, lo, hi):  # the rows goodput() reads around the knee
            if 0 <= i < len(rates):
                eff(i, cell)
    return [r for rate in sorted(seen) for r in seen[rate]]


def unit(args) -> list[dict]:
    """One (system, workload, seed, cell or None) bisection; None: every cell from one run."""
    label, workload, seed, cell = args
    system, duration = _system(label), DURATION[workload]
    cells = [cell] if cell else [(t, s) for t in TPOTS for s in TTFT_SCALES]
    tpots, scales = ((cell[0],), (cell[1],)) if cell else (TPOTS, TTFT_SCALES)

    def probe(rate: float) -> list[dict]:
        rows = run_cells(system, workload, seed, rate, tpots, scales, duration)
        return [r | {"duration_s": duration} for r in rows]

    return bisect_sweep(probe, RATES[workload], cells)


def units(seeds, workloads=WORKLOADS) -> list[tuple]:
    out = []
    for seed in seeds:
        for w in workloads:
            out += [(label, w, seed, None) for label in STATIC]
            out += [(HYBRID.label, w, seed, (t, s)) for t in TPOTS for s in TTFT_SCALES]
    return out


def goodputs(rows: list[dict]) -> dict[tuple[str, str, Cell], dict[int, float]]:
    """(system, workload, cell) -> {seed: goodput@90}."""
    sweeps: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["system"], r["workload"], (r["tpot_s"], r["ttft_scale"]), int(r["seed"]))
        sweeps.setdefault(key, []).append(r)
    out: dict[tuple[str, str, Cell], dict[int, float]] = {}
    for (system, w, cell, seed), sel in sweeps.items():
        out.setdefault((system, w, cell), {})[seed] = goodput(sel)
    return out


def main(argv: list[str] | None = None) -> int:
    from bucketserve.sim.evidence_report import append_rows
    from bucketserve.sim.killtest_report import render

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p, "perf/results/sim/killtest", seeds=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    a = p.parse_args(argv)

    def run(kept: list[dict], partial: Path) -> list[dict]:
        done = {_key(r) for r in kept}
        todo = [u for u in units(range(a.seeds), a.workloads.split(",")) if u not in done]
        todo.sort(key=lambda u: (u[3] is None, u[1], u[2]))  # the long per-cell units first
        return run_pool(unit, todo, a.workers, lambda r: append_rows(r, partial),
                        lambda r: f"{r['system']:22s} {r['workload']:7s} seed {r['seed']}")  # fmt: skip

    return run_resumable(a, run, render)


def _key(r: dict) -> tuple:
    cell = (r["tpot_s"], r["ttft_scale"]) if r["system"] == HYBRID.label else None
    return r["system"], r["workload"], int(r["seed"]), cell


if __name__ == "__main__":
    raise SystemExit(main())
