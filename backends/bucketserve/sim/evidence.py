"""The evidence behind docs/scheduling.md, regenerated from scratch by one command:

    python -m bucketserve.sim.evidence --out perf/results/sim/evidence --doc docs/scheduling.md

Method (the same for every table): Llama-2-13B on 4 x A100-40GB (roofline latency), Poisson
arrivals, SEEDS seeds (common random numbers: seed k gives every system the same requests),
DURATION seconds of arrivals per run, one fixed rate grid per workload (GRID). Each
(system, workload, seed) sweeps the grid upwards and stops after the first rate that neither
SLO definition sustains at 80 %. A rate counts only if the backlog did not grow
(steady.detect); its attainment is the worse of the whole run's and its last third's.
Goodput is clamped to the sustained capacity (the highest served rate seen).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import summarize
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests

SEEDS = (0, 1, 2, 3, 4)
GRID = {
    "mixed": tuple(0.5 * i for i in range(2, 29)),  # 1.0, 1.5, ..., 14.0 req/s
    "alpaca": tuple(4.0 * i for i in range(1, 19)),  # 4, 8, ..., 72 req/s
}
# Mixed requests live up to ~10 s (300 output tokens), Alpaca ones ~4 s: both horizons are
# 20-30 lifetimes, the detector flags any run whose backlog still grows, and the horizon
# check reruns one system with 3x longer runs. Alpaca ran 40 s until the detector's growth
# tolerance fell from 5 % to 2 % (sim/steady.py): 40 s runs then failed on the in-flight
# count's warm-up noise (sarathi at 16 req/s, capacity ~60); at 120 s they do not.
DURATION = {"mixed": 200.0, "alpaca": 120.0}
TARGETS = (0.8, 0.9, 0.99)
STOP_BELOW = min(TARGETS)  # past the lowest target, higher rates cannot change goodput
COARSE = 4  # first pass: every 4th grid point


def effective_attainment(row: dict, tail: bool = False) -> float:
    """metrics.effective_attainment on a row dict (0 when the backlog grew)."""
    if row["growing"]:
        return 0.0
    att = row["attainment_tail" if tail else "attainment"]
    late = row["late_attainment_tail" if tail else "late_attainment"]
    return att if late != late else min(att, late)


LATENCY = RooflineLatency(LLAMA2_13B, A100_40GB)
BASE = ClusterSpec.for_hardware(LLAMA2_13B, A100_40GB)  # 2P2D for P/D, 4 aggregated
SERVER_RUN = Path("perf/results/2026-12-01-x86_64-cpu2-smoke-validation")
BENCH = Path("perf/results/engine_bench_cpu_2026-12-01-validation-1thread.jsonl")


@dataclass(slots=True, frozen=True)
class System:
    """One row of a table: a policy on a deployment, with scheduler overrides."""

    label: str
    policy: str
    cluster: dict = field(default_factory=dict)
    sched: dict = field(default_factory=dict)
    workloads: tuple[str, ...] = ("mixed", "alpaca")
    group: str = "main"
    duration: float | None = None  # None: DURATION[workload]


PD = {"topology": "pd"}
MIXED = ("mixed",)
SYSTEMS = (
    System("static (HF-like)", "static"),
    System("fcfs (vLLM-like, colocated)", "fcfs"),
    System("sarathi (fcfs, chunked 512)", "fcfs", {"topology": "chunked"}),
    System("distserve 1P3D", "distserve", PD | {"num_prefill": 1, "num_decode": 3}),
    System("distserve 2P2D", "distserve", PD),
    System("distserve 3P1D", "distserve", PD | {"num_prefill": 3, "num_decode": 1}),
    System("sjf 2P2D", "sjf", PD),
    System("edf 2P2D", "edf", PD),
    System("bucketserve 2P2D", "bucketserve", PD),
    System("bucketserve+ 2P2D", "bucketserve+", PD),
    System("bucketserve+ chunked", "bucketserve+", {"topology": "chunked"}),
    System("bullet (SM-shared)", "bullet"),
    System("scls (slices of 128)", "scls"),
    # padded prefill (the paper's premise), both workloads
    System("fcfs-pad 2P2D (padded)", "fcfs-pad", PD | {"padded_prefill": True}, group="padded"),
    System("distserve 2P2D (padded)", "distserve", PD | {"padded_prefill": True}, group="padded"),
    System("bucketserve 2P2D (padded)", "bucketserve", PD | {"padded_prefill": True}, group="padded"),
    # one mechanism at a time, Mixed
    System("bucketserve, no task types", "bucketserve", PD, {"bucket_by_task_type": False}, MIXED, "ablation"),
    System("bucketserve+, one bucket", "bucketserve+", PD, {"max_buckets": 1}, MIXED, "ablation"),
    System("bucketserve+, no output reserve", "bucketserve+", PD, {"output_reserve": "none"}, MIXED, "ablation"),
    System("bucketserve+, prefill-only admission", "bucketserve+", PD, {"admission": "prefill"}, MIXED, "ablation"),
    System("edf chunked", "edf", {"topology": "chunked"}, {}, MIXED, "ablation"),
    # horizon check: the system the 120 s runs flattered most, with 3x longer runs
    System("bucketserve+ 2P2D, 600 s", "bucketserve+", PD, {}, MIXED, "horizon", 600.0),
)  # fmt: skip


def _run(system: System, cluster: ClusterSpec, workload: str, seed: int, rate: float) -> dict:
    duration = system.duration or DURATION[workload]
    spec = WorkloadSpec(workload, max(int(rate * duration), 50), rate, seed=seed)
    cfg = cluster.scheduler_config(spec.max_model_len, system.sched, system.policy)
    cpu = time.process_time()
    out = Simulator(system.policy, make_requests(spec), cluster, LATENCY, cfg).run()
    m = summarize(out, workload, rate)
    m.policy, m.seed = system.label, seed
    extra = {"group": system.group, "duration_s": duration, "cpu_s": time.process_time() - cpu}
    return m.as_dict() | extra


def _crosses(lo: dict, hi: dict) -> bool:
    """Some goodput target lies between two adjacent evaluated rates."""
    pairs = ((effective_attainment(lo, t), effective_attainment(hi, t)) for t in (False, True))
    return any(a >= x > b for a, b in pairs for x in TARGETS)


def sweep(system: System, workload: str, seed: int) -> list[dict]:
    """One system's sweep: every COARSE-th grid point upwards until the 80 % crossing is
    passed, then bisection on the grid inside every pair of evaluated rates that brackets a
    target. Goodput interpolates only between the two grid points around its crossing, so
    with attainment falling in rate this equals evaluating the whole grid."""
    cluster = replace(BASE, **system.cluster)
    grid = GRID[workload]
    rows: dict[int, dict] = {}
    for i in range(0, len(grid), COARSE):
        rows[i] = m = _run(system, cluster, workload, seed, grid[i])
        if max(effective_attainment(m), effective_attainment(m, True)) < STOP_BELOW:
            break
    while True:
        done = sorted(rows)
        gaps = [(lo, hi) for lo, hi in zip(done, done[1:], strict=False)
                if hi - lo > 1 and _crosses(rows[lo], rows[hi])]  # fmt: skip
        if not gaps:
            return [rows[i] for i in sorted(rows)]
        for lo, hi in gaps:
            mid = (lo + hi) // 2
            rows[mid] = _run(system, cluster, workload, seed, grid[mid])


def _unit(args: tuple[System, str, int]) -> list[dict]:
    return sweep(*args)


OFFLINE = (("static (HF-like)", "static", {}), ("distserve 2P2D", "distserve", PD),
           ("bucketserve 2P2D", "bucketserve", PD))  # fmt: skip


def offline(seed: int, n: int = 1000) -> list[dict]:
    """Offline throughput: n Mixed requests, all queued at t=0 (offline SLO class)."""
    spec = WorkloadSpec("mixed", n, 1e6, seed=seed, slo_class="offline")
    rows = []
    for label, policy, kw in OFFLINE:
        cluster = replace(BASE, **kw)
        cfg = cluster.scheduler_config(spec.max_model_len, None, policy)
        m = summarize(
            Simulator(policy, make_requests(spec), cluster, LATENCY, cfg).run(), "mixed", 1e6
        )
        rows.append({"system": label, "seed": seed, "throughput_tok_s": m.throughput_tok_s})
    return rows


def run_all(systems=SYSTEMS, seeds=SEEDS, workers: int = 2, sink=None, done=()) -> list[dict]:
    """Every (system, workload, seed) sweep not in `done` on up to `workers` processes, the
    main table's first (Mixed, then Alpaca); `sink(rows)` gets each finished sweep."""
    order = {"main": 0, "padded": 1, "ablation": 2, "horizon": 3}
    units = sorted(((s, w, seed) for s in systems for w in s.workloads for seed in seeds
                    if (s.label, w, seed) not in done),
                   key=lambda u: (order[u[0].group], u[1] != "mixed", u[2]))  # fmt: skip
    rows: list[dict] = []
    t0 = time.perf_counter()
    with get_context("fork").Pool(workers) as pool:
        for i, result in enumerate(pool.imap_unordered(_unit, units), 1):
            rows += result
            if sink is not None:
                sink(result)
            last = result[-1]
            print(f"[{i}/{len(units)} {time.perf_counter() - t0:6.0f} s] {last['policy']:40s} "
                  f"{last['workload']:7s} seed {last['seed']}: {len(result)} rates, "
                  f"top {last['rate']}", flush=True)  # fmt: skip
    return rows


OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--out", dict(type=Path, default=Path("perf/results/sim/evidence"))),
    ("--doc", dict(type=Path, default=None, help="splice the tables into this file")),
    ("--workers", dict(type=int, default=2, help="processes (<= 2 on shared machines)")),
    ("--seeds", dict(type=int, default=len(SEEDS))),
    ("--render-only", dict(action="store_true", help="re-render from --out/runs.csv")),
    ("--resume", dict(action="store_true", help="keep the sweeps in runs.partial.csv")),
    ("--server-run", dict(type=Path, default=SERVER_RUN, help="smoke run to check against")),
    ("--bench", dict(type=Path, default=BENCH, help="engine_bench JSON lines to fit")),
)


def sweep_rows(a: argparse.Namespace, runs: Path, partial: Path, off_csv: Path):
    """(online rows, offline rows) of a fresh or resumed run, written to runs / off_csv."""
    from bucketserve.sim.evidence_report import append_rows, read_rows, write_rows

    seeds = tuple(range(a.seeds))
    if a.resume and off_csv.exists():
        off = read_rows(off_csv)
    else:
        with get_context("fork").Pool(a.workers) as pool:
            off = [r for rs in pool.map(offline, seeds) for r in rs]
        write_rows(off, off_csv)
    kept = read_rows(partial) if a.resume and partial.exists() else []
    keep = {s.label for s in SYSTEMS}
    kept = [r | {"cpu_s": r.get("cpu_s", float("nan"))} for r in kept if r["policy"] in keep]
    partial.unlink(missing_ok=True)
    if kept:
        append_rows(kept, partial)
    done = {(r["policy"], r["workload"], int(r["seed"])) for r in kept}
    rows = kept + run_all(seeds=seeds, workers=a.workers, done=done,
                          sink=lambda r: append_rows(r, partial))  # fmt: skip
    write_rows(rows, runs)
    partial.unlink()
    return rows, off


def main(argv: list[str] | None = None) -> int:
    from bucketserve.sim.evidence_report import read_rows, render, write_rows

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kw in OPTIONS:
        p.add_argument(flag, **kw)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs, partial, off_csv = (a.out / n for n in ("runs.csv", "runs.partial.csv", "offline.csv"))
    if a.render_only:  # an interrupted run renders what it finished (runs.partial.csv)
        rows = read_rows(runs if runs.exists() else partial)
        off = read_rows(off_csv) if off_csv.exists() else []
    else:
        rows, off = sweep_rows(a, runs, partial, off_csv)
    wall = time.perf_counter() - t0
    validation = None
    stored = a.out / "validation.csv"
    if a.server_run.exists() and a.bench.exists():
        from bucketserve.sim.latency import FittedLatency
        from bucketserve.sim.validate import SMOLLM2, compare_run, has_request_logs, read_validation

        if has_request_logs(a.server_run):
            vrows, model = compare_run(a.server_run, a.bench)
            write_rows(vrows, stored)
        elif stored.exists():  # a fresh clone: the server run's per-request logs are not committed
            print(f"validation: no per-request logs under {a.server_run}; rendering {stored}")
            vrows = read_validation(stored)
            model = FittedLatency.from_jsonl(a.bench, SMOLLM2.kv_bytes_per_token).describe()
        else:
            raise SystemExit(f"--server-run: no requests/*_rate*.jsonl under {a.server_run} "
                             f"and no stored {stored}")  # fmt: skip
        validation = (vrows, model, str(a.server_run))
    render(rows, off, a.out, a.doc, None if a.render_only else wall, validation)
    print(f"wrote {a.out} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
