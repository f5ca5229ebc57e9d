"""The kill test: adaptive hybrid instances against the best static configuration, per cell.

    python -m bucketserve.sim.killtest --seeds 3 --out perf/results/sim/killtest \\
        --doc docs/scheduling.md

Cells as in sim/grid.py (TPOT {40, 60, 100 ms} x TTFT scale {0.5, 1, 2} x {Mixed, Alpaca,
phased}). Static candidates: the configurations that win a cell of the seed-0 grid
(`--grid`, sim/grid.py's rows.csv, whose seed-0 runs are reused: same requests, rates and
search) plus Sarathi TP2 512; every one SLO-blind: one run per rate, judged in all nine cells.
The hybrid (`scheduling.roles.RoleController` over two TP2 instances, sim/hybrid.py) reads
the cell's SLOs, so it runs once per cell, after the statics: its search starts at the best
static's knee for that seed and cell and walks to its own. Each (system, cell, seed)
goodput@90 comes from that knee search over the grid's rate list (sim/grid.py knee_sweep;
attainment assumed to fall with the rate; every probed rate is kept in rows.csv), steady-state
rules as in the grid (sim/steady.py). The ratio per cell is the hybrid's goodput over the best
static configuration's (chosen by its mean over seeds), paired by seed (same requests), mean
and 95 % CI over seeds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bucketserve.sim.grid import (
    DURATION,
    HY,
    RATES,
    SYSTEMS,
    TP2_AGG,
    TPOTS,
    TTFT_SCALES,
    WORKLOADS,
    Cell,
    GridSystem,
    add_run_args,
    goodput,
    knee_sweep,
    run_cells,
    run_pool,
    run_resumable,
)

ALWAYS = ("sarathi TP2 512",)  # the colocated TP2 configuration the hybrid is built from
HYBRID = GridSystem("hybrid adaptive TP2", "hybrid", "fcfs",
                    HY | TP2_AGG | {"adaptive_roles": True}, 2, True)  # fmt: skip
CELLS = [(t, s) for t in TPOTS for s in TTFT_SCALES]


def _system(label: str) -> GridSystem:
    return HYBRID if label == HYBRID.label else next(s for s in SYSTEMS if s.label == label)


def candidates(grid_rows: list[dict]) -> tuple[str, ...]:
    """ALWAYS plus every configuration that wins a cell of the grid's seed 0."""
    from bucketserve.sim.grid_report import best, goodputs

    g = goodputs([r for r in grid_rows if int(r["seed"]) == 0])
    won = {best(g, w, cell)[0] for w in WORKLOADS for cell in CELLS} - {"—"}
    return tuple(dict.fromkeys([*ALWAYS, *sorted(won)]))


def unit(args) -> list[dict]:
    """One (system, workload, seed, cell or None) knee search; None: every cell from one run.
    `hint`: the rate index the search starts at; `known`: rows already run, by rate."""
    label, workload, seed, cell, hint, known = args
    system, duration = _system(label), DURATION[workload]
    cells = [cell] if cell else CELLS
    tpots, scales = ((cell[0],), (cell[1],)) if cell else (TPOTS, TTFT_SCALES)

    def probe(rate: float) -> list[dict]:
        rows = run_cells(system, workload, seed, rate, tpots, scales, duration)
        return [r | {"duration_s": duration} for r in rows]

    hints = {cell: hint} if cell and hint is not None else None
    return knee_sweep(probe, RATES[workload], cells, hint=hints, known=known)


def static_units(statics, seeds, workloads=WORKLOADS, grid_rows=()) -> list[tuple]:
    """Each static's sweeps; a seed the grid ran comes with its rows (nothing left to run
    unless the rates differ)."""
    out = []
    for seed in seeds:
        for w in workloads:
            for label in statics:
                known: dict[float, list[dict]] = {}
                for r in grid_rows:
                    if (r["system"], r["workload"], int(r["seed"])) == (label, w, seed):
                        known.setdefault(r["rate"], []).append(r)
                out.append((label, w, seed, None, None, known or None))
    return out


def hybrid_units(seeds, workloads=WORKLOADS, static_rows=()) -> list[tuple]:
    """The hybrid once per cell, its search started at the best static's knee (its seed)."""
    g = goodputs([r for r in static_rows if r["system"] != HYBRID.label])
    out = []
    for seed in seeds:
        for w in workloads:
            for cell in CELLS:
                top = max((v[seed] for (_, w2, c), v in g.items()
                           if (w2, c) == (w, cell) and seed in v), default=None)  # fmt: skip
                hint = (
                    None
                    if top is None
                    else max((i for i, r in enumerate(RATES[w]) if r <= top), default=0)
                )
                out.append((HYBRID.label, w, seed, cell, hint, None))
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
    from bucketserve.sim.grid_report import read_grid
    from bucketserve.sim.killtest_report import render

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p, "perf/results/sim/killtest", seeds=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--grid", type=Path, default=Path("perf/results/sim/grid/rows.csv"),
                   help="the SLO grid's rows (python -m bucketserve.sim.grid)")  # fmt: skip
    a = p.parse_args(argv)

    def run(kept: list[dict], partial: Path) -> list[dict]:
        if not a.grid.exists():
            raise SystemExit(f"--grid: {a.grid} does not exist; run python -m "
                             "bucketserve.sim.grid first (its winners are the candidates)")  # fmt: skip
        grid_rows = read_grid(a.grid)
        statics = candidates(grid_rows)
        print(f"static candidates (seed-0 grid winners and {', '.join(ALWAYS)}): "
              f"{', '.join(statics)}", flush=True)  # fmt: skip
        seeds, workloads = range(a.seeds), a.workloads.split(",")
        done = {_key(r) for r in kept}
        sink = lambda r: append_rows(r, partial)  # noqa: E731
        describe = lambda r: f"{r['system']:26s} {r['workload']:7s} seed {int(r['seed'])}"  # noqa: E731
        todo = [u for u in static_units(statics, seeds, workloads, grid_rows)
                if u[:4] not in done]  # fmt: skip
        rows = run_pool(unit, todo, a.workers, sink, describe)
        todo = [u for u in hybrid_units(seeds, workloads, kept + rows) if u[:4] not in done]
        todo.sort(key=lambda u: (u[1], u[2]))
        return rows + run_pool(unit, todo, a.workers, sink, describe)

    return run_resumable(a, run, render)


def _key(r: dict) -> tuple:
    cell = (r["tpot_s"], r["ttft_scale"]) if r["system"] == HYBRID.label else None
    return r["system"], r["workload"], int(r["seed"]), cell


if __name__ == "__main__":
    raise SystemExit(main())
