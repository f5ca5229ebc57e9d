"""The SLO grid: the best static configuration per (workload, TPOT SLO, TTFT scale) cell.

    python -m bucketserve.sim.grid --out perf/results/sim/grid --doc docs/scheduling.md

Cells: TPOT {40, 60, 100 ms} x TTFT scale {0.5, 1, 2} (x the default max(0.25 s, 1.5 ms x
prompt tokens)) x {Mixed, Alpaca, phased}. Configurations: DistServe's P:D ratios at TP1 and
1P1D at TP2, Sarathi (fcfs) chunked 256/512/1024 at TP1 and 512 at TP2, EDF chunked 512, Bullet (decode held to 0.5 and
0.9 x TPOT), vLLM-like aggregated fcfs, bucketserve+ chunked, and two static-slider
hybrids (sim/hybrid.py); always 4 GPUs.

A run's simulation does not depend on the SLO unless its policy reads it (EDF deadlines,
bucketserve+ slack, Bullet's SM split), so SLO-blind systems run once per rate and every cell
is judged from the same requests; SLO-aware ones run once per TPOT, their requests carrying
that TPOT and the default TTFT (the TTFT scale only changes how they are judged). Per cell,
each run counts if steady (steady.detect on that cell's SLO) with the worse of its whole-run
and last-third attainment; goodput@90 interpolates between the last rate that reaches 90 %
and the first that does not. Each sweep finds those two rates per cell by bisection over the
rate list (attainment assumed to fall with the rate; every probed rate is kept in rows.csv).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from bucketserve.scheduling import DEFAULT_SLOS
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import tpot
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.steady import detect
from bucketserve.sim.workload import SimRequest, WorkloadSpec, make_requests

TPOTS = (0.04, 0.06, 0.1)
TTFT_SCALES = (0.5, 1.0, 2.0)
WORKLOADS = ("mixed", "alpaca", "phased")
# Mixed and phased: 600 s; Alpaca requests live ~4 s: 300 s is ~75 lifetimes (60 s runs
# failed every system at 48 req/s on warm-up growth of the in-flight count, not on a queue:
# every system tied at 40.8 req/s); the detector fails any run that is not steady
DURATION = {"mixed": 600.0, "alpaca": 300.0, "phased": 600.0}
RATES = {
    "mixed": (*(float(r) for r in range(1, 11)), 12.0, 14.0, 16.0, 18.0, 20.0),
    "alpaca": tuple(8.0 * i for i in range(1, 17)),  # 8..128: chunked TP2 passes 96, fails 104
    "phased": (*(float(r) for r in range(1, 11)), 12.0, 14.0, 16.0, 18.0, 20.0),
}
TARGET = 0.9
Cell = tuple[float, float]
LATENCY = {tp: RooflineLatency(LLAMA2_13B, A100_40GB, tp) for tp in (1, 2)}
BASE = {tp: ClusterSpec.for_hardware(LLAMA2_13B, A100_40GB, tp) for tp in (1, 2)}


@dataclass(slots=True, frozen=True)
class GridSystem:
    """One static configuration: policy, deployment, TP degree (4 GPUs in all)."""

    label: str
    family: str
    policy: str
    cluster: dict = field(default_factory=dict)
    tp: int = 1
    slo_aware: bool = False


PD, CH, HY = {"topology": "pd"}, {"topology": "chunked"}, {"topology": "hybrid"}
TP2_PD, TP2_AGG = PD | {"num_prefill": 1, "num_decode": 1}, {"num_aggregated": 2}
SYSTEMS = (
    GridSystem("distserve 1P3D", "distserve", "distserve", PD | {"num_prefill": 1, "num_decode": 3}),
    GridSystem("distserve 2P2D", "distserve", "distserve", PD),
    GridSystem("distserve 3P1D", "distserve", "distserve", PD | {"num_prefill": 3, "num_decode": 1}),
    GridSystem("distserve TP2 1P1D", "distserve", "distserve", TP2_PD, 2),
    GridSystem("sarathi 256", "chunked", "fcfs", CH | {"chunk_tokens": 256}),
    GridSystem("sarathi 512", "chunked", "fcfs", CH),
    GridSystem("sarathi 1024", "chunked", "fcfs", CH | {"chunk_tokens": 1024}),
    GridSystem("sarathi TP2 512", "chunked", "fcfs", CH | TP2_AGG, 2),
    GridSystem("edf chunked 512", "chunked", "edf", CH, 1, True),
    GridSystem("bucketserve+ chunked 512", "chunked", "bucketserve+", CH, 1, True),
    GridSystem("bullet", "bullet", "bullet", {}, 1, True),
    GridSystem("bullet 0.9 TPOT", "bullet", "bullet", {"bullet_tpot_share": 0.9}, 1, True),
    GridSystem("vllm-like aggregated", "aggregated", "fcfs", {"topology": "aggregated"}),
    # static-slider hybrids (sim/hybrid.py): prefill-heavy instances hand decodes over
    GridSystem("hybrid 2x2048 + 2 decode-only", "hybrid", "fcfs", HY | {"chunk_budgets": (2048, 2048, 0, 0)}),
    GridSystem("hybrid 1024 + 2x256 + 1 decode-only", "hybrid", "fcfs", HY | {"chunk_budgets": (1024, 256, 256, 0)}),
)  # fmt: skip


def cell_ok(r: SimRequest, tpot_s: float, scale: float) -> bool:
    """The request met the cell's SLO: TTFT <= scale x default and mean TPOT <= tpot_s."""
    if math.isnan(r.finish_s):
        return False
    limit = scale * DEFAULT_SLOS[r.meta.slo_class].ttft_for(r.meta.prompt_len)
    return r.first_token_s - r.meta.arrival_s <= limit and tpot(r) <= tpot_s


def judge(reqs: list[SimRequest], tpot_s: float, scale: float) -> dict:
    """One run under one cell's SLO: attainment, last third, steady, effective attainment."""
    ok = {id(r): cell_ok(r, tpot_s, scale) for r in reqs}
    st = detect(reqs, lambda r: ok[id(r)])
    att = sum(ok.values()) / len(reqs)
    late = st.late_attainment
    eff = 0.0 if not st.steady else (att if math.isnan(late) else min(att, late))
    return {"tpot_s": tpot_s, "ttft_scale": scale, "attainment": att, "late_attainment": late,
            "steady": st.steady, "final_backlog": st.final_backlog, "effective": eff}  # fmt: skip


def run_cells(system: GridSystem, workload: str, seed: int, rate: float, tpots,
              scales=TTFT_SCALES, duration: float | None = None) -> list[dict]:  # fmt: skip
    """One simulation, judged under every cell with a TPOT in `tpots` and a TTFT scale in
    `scales`; an SLO-aware system given one scale has its requests carry it."""
    duration = duration or DURATION[workload]
    aware = system.slo_aware
    spec = WorkloadSpec(workload, max(int(rate * duration), 50), rate, seed=seed,
                        tpot_s=tpots[0] if aware else None,
                        ttft_scale=scales[0] if aware and len(scales) == 1 else 1.0)  # fmt: skip
    cluster = replace(BASE[system.tp], **system.cluster)
    cfg = cluster.scheduler_config(spec.max_model_len, None, system.policy)
    cpu = time.process_time()
    reqs = make_requests(spec)
    sim = Simulator(system.policy, reqs, cluster, LATENCY[system.tp], cfg)
    sim.run()
    done = [r for r in reqs if not math.isnan(r.finish_s)]
    base = {"system": system.label, "family": system.family, "tp": system.tp,
            "workload": workload, "seed": seed, "rate": rate, "duration_s": duration,
            "served_rate": len(done) / max(r.finish_s for r in done) if done else 0.0}  # fmt: skip
    if getattr(sim.engine, "controller", None) is not None:  # adaptive hybrid: what it did
        base |= {"role_changes": sim.engine.controller.changes,
                 "migrations": sim.engine.migrations}  # fmt: skip
    rows = [base | judge(reqs, t, s) for t in tpots for s in scales]
    cpu = time.process_time() - cpu
    return [r | {"cpu_s": cpu / len(rows)} for r in rows]


def knee_sweep(probe, rates, cells: list[Cell], hint: dict[Cell, int] | None = None,
               known: dict[float, list[dict]] | None = None) -> list[dict]:  # fmt: skip
    """Rows of the rates a search per cell probes (probe(rate) -> rows of every cell,
    memoised; `known` rows by rate count as probed): enough for goodput() to find each cell's
    last passing rate and first miss, assuming attainment falls with the rate. A cell with a
    `hint` (an index into rates, e.g. another system's knee) walks from there, one rate at a
    time, to the knee; the others bisect."""
    seen = dict(known or {})

    def eff(i: int, cell: Cell) -> float:
        if rates[i] not in seen:
            seen[rates[i]] = probe(rates[i])
        row = next(r for r in seen[rates[i]] if (r["tpot_s"], r["ttft_scale"]) == cell)
        return row["effective"]

    for cell in cells:
        if hint and cell in hint:
            i = min(max(hint[cell], 0), len(rates) - 1)
            step = 1 if eff(i, cell) >= TARGET else -1
            while 0 <= i + step < len(rates) and (eff(i + step, cell) >= TARGET) == (step > 0):
                i += step
            if 0 <= i + step < len(rates):  # the rate across the knee
                eff(i + step, cell)
            continue
        lo, hi = -1, len(rates)  # eff(lo) >= TARGET (or none), eff(hi) < TARGET (or none)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if eff(mid, cell) >= TARGET else (lo, mid)
        for i in (lo - 1, lo, hi):  # the rows goodput() reads around the knee
            if 0 <= i < len(rates):
                eff(i, cell)
    return [r for rate in sorted(seen) for r in seen[rate]]


def sweep(system: GridSystem, workload: str, seed: int, tpots,
          known: dict[float, list[dict]] | None = None) -> list[dict]:  # fmt: skip
    """One system's rows on one workload and seed: a knee search over the rates for every
    cell of its runs (an SLO-aware system: one TPOT, every TTFT scale)."""
    cells = [(t, s) for t in tpots for s in TTFT_SCALES]
    return knee_sweep(lambda rate: run_cells(system, workload, seed, rate, tpots),
                      RATES[workload], cells, known=known)  # fmt: skip


def units(systems=SYSTEMS, workloads=WORKLOADS, seeds=(0,)) -> list[tuple]:
    """(system, workload, seed, tpots) sweeps: SLO-aware systems once per TPOT."""
    out = []
    for seed in seeds:
        for w in workloads:
            for s in systems:
                for tpots in [(t,) for t in TPOTS] if s.slo_aware else [TPOTS]:
                    out.append((s, w, seed, tpots))
    return out


def goodput(rows: list[dict], target: float = TARGET) -> float:
    """Highest rate reaching `target` (rows of one sweep and cell, by rate), interpolated
    towards the first rate above it that misses; 0 if the lowest rate misses."""
    rows = sorted(rows, key=lambda r: r["rate"])
    best = 0.0
    for lo, hi in zip(rows, [*rows[1:], None], strict=True):
        if lo["effective"] < target:
            break
        best = lo["rate"]
        if hi is not None and hi["effective"] < target:
            frac = (lo["effective"] - target) / (lo["effective"] - hi["effective"])
            best += frac * (hi["rate"] - lo["rate"])
            break
    return best


def _unit(args) -> list[dict]:
    return sweep(*args)


def run_pool(fn, todo: list, workers: int, sink, describe) -> list[dict]:
    """fn over todo on `workers` processes; each result goes to `sink` as it lands (so an
    interrupted run keeps it) and gets a progress line."""
    rows: list[dict] = []
    t0 = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        for i, result in enumerate(pool.imap_unordered(fn, todo), 1):
            rows += result
            sink(result)
            print(f"[{i}/{len(todo)} {time.perf_counter() - t0:6.0f} s] {describe(result[-1])}",
                  flush=True)  # fmt: skip
    return rows


def add_run_args(p: argparse.ArgumentParser, out: str, seeds: int) -> None:
    """The options every resumable simulation command takes."""
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--doc", type=Path, default=None, help="splice the tables into this file")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seeds", type=int, default=seeds)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--resume", action="store_true", help="keep the units in rows.partial.csv")


def run_resumable(a: argparse.Namespace, run, render) -> int:
    """Render a.out's rows, or run(kept rows, partial path) -> new rows after what a resumed
    run kept, write rows.csv and render; the run time goes into the method paragraph."""
    from bucketserve.sim.evidence_report import write_rows
    from bucketserve.sim.grid_report import read_grid

    a.out.mkdir(parents=True, exist_ok=True)
    final, partial = a.out / "rows.csv", a.out / "rows.partial.csv"
    t0 = time.perf_counter()
    if a.render_only:
        rows = read_grid(final if final.exists() else partial)
    else:
        kept = read_grid(partial) if a.resume and partial.exists() else []
        rows = kept + run(kept, partial)
        write_rows(rows, final)
        partial.unlink(missing_ok=True)
    render(rows, a.out, a.doc, None if a.render_only else time.perf_counter() - t0)
    print(f"wrote {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from bucketserve.sim.evidence_report import append_rows
    from bucketserve.sim.grid_report import render

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p, "perf/results/sim/grid", seeds=1)
    a = p.parse_args(argv)

    def run(kept: list[dict], partial: Path) -> list[dict]:
        done = {(r["system"], r["workload"], int(r["seed"]), r["tpot_s"]) for r in kept}
        todo = [u for u in units(seeds=tuple(range(a.seeds)))
                if (u[0].label, u[1], u[2], u[3][0]) not in done]  # fmt: skip
        # Mixed whole, then the SLO-blind sweeps of Alpaca and phased, then their SLO-aware
        # ones (an interrupted run renders what it finished)
        todo.sort(key=lambda u: (u[1] != "mixed", len(u[3]) == 1, u[1] == "phased"))
        return run_pool(_unit, todo, a.workers, lambda r: append_rows(r, partial),
                        lambda r: f"{r['system']:26s} {r['workload']:7s} tpot {r['tpot_s']}: "
                                  f"top {r['rate']}")  # fmt: skip

    return run_resumable(a, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
