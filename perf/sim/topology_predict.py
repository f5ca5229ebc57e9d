"""The simulator's prediction of a measured topology comparison, beside what the server did.

Replays every (label, rate) request file of `perf/load/compare.py --topologies ...` runs (their
send times, prompt and output lengths, SLOs) through the simulator with latency models fitted
to the CPU engine: `bucketserve@disaggregated` as one prefill and one decode instance on one
thread each, `bucketserve@colocated` as one chunked instance (Sarathi-style fused iterations of 64 tokens)
on both threads, `@colocatedx2` as two such instances of 32 tokens on one thread each, `@hybrid`
as two hybrid instances of one thread (budgets 32 mixed / 2,048 prefill-heavy / 0, the
adaptive RoleController and slack migration the server runs). One constant the engine fit cannot see, the per-request
path outside the engine (tokenizer, Triton hops, first response), is estimated per label as
the TTFT gap at its lowest rate and added to every simulated TTFT (`sim/validate.py`).
Prints per-rate attainment (measured vs simulated) and goodput@90 per run, as Markdown.

    .venv/bin/python perf/sim/topology_predict.py perf/results/2026-12-03-*-topology-seed*
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
from bucketserve.bench.metrics import goodput
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.latency import FittedLatency
from bucketserve.sim.metrics import tpot
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.validate import BLOCK, POOL_BYTES, SMOLLM2, server_requests

RESULTS = Path(__file__).resolve().parents[1] / "results"
ONE_THREAD = RESULTS / "engine_bench_cpu_2026-12-01-fresh-1thread.jsonl"
TWO_THREADS = RESULTS / "engine_bench_cpu_2026-12-01-fresh.jsonl"
# topology label -> (engine fit for its instances' threads, colocated instances, chunk tokens)
DEPLOYMENTS = {
    "disaggregated": (ONE_THREAD, 0, 0),  # 1P1D, one thread each
    "colocated": (TWO_THREADS, 1, 64),  # one instance on both cores
    "colocatedx2": (ONE_THREAD, 2, 32),  # two instances, one core each
    "hybrid": (ONE_THREAD, 2, 32),  # two hybrid instances, one core each, adaptive roles
}


def cluster_for(topology: str) -> ClusterSpec:
    blocks = POOL_BYTES // (BLOCK * SMOLLM2.kv_bytes_per_token)
    _, instances, chunk = DEPLOYMENTS[topology]
    if topology == "hybrid":
        return ClusterSpec(blocks, SMOLLM2.kv_bytes_per_token, BLOCK, 1, 1, instances,
                           topology="hybrid", chunk_tokens=chunk, adaptive_roles=True)  # fmt: skip
    if instances:
        return ClusterSpec(blocks, SMOLLM2.kv_bytes_per_token, BLOCK, 1, 1, instances,
                           topology="chunked", chunk_tokens=chunk)  # fmt: skip
    return ClusterSpec(blocks, SMOLLM2.kv_bytes_per_token, BLOCK, 1, 1, 1, topology="pd")


def simulate(path: Path) -> tuple[str, float, list]:
    """(label, rate, simulated requests) of one request file."""
    label, rate = path.stem.rsplit("_rate", 1)
    policy, topology = label.split("@") if "@" in label else (label, "disaggregated")
    reqs = server_requests(path)
    latency = FittedLatency.from_jsonl(DEPLOYMENTS[topology][0], SMOLLM2.kv_bytes_per_token,
                                       impl="bucketserve")  # fmt: skip
    Simulator(policy, reqs, cluster_for(topology), latency,
              max_model_len=SMOLLM2.max_len).run()  # fmt: skip
    return label, float(rate), reqs


def attainment(reqs, path_s: float) -> float:
    ok = 0
    for r in reqs:
        if math.isnan(r.finish_s):
            continue
        ttft = r.first_token_s - r.meta.arrival_s + path_s
        ok += ttft <= r.meta.ttft_slo_s and tpot(r) <= r.meta.tpot_slo_s
    return ok / len(reqs)


def mean_ttft(reqs, real: bool) -> float:
    if real:
        vals = [
            r.extra["real"]["ttft_s"] for r in reqs if r.extra["real"].get("ttft_s") is not None
        ]
    else:
        vals = [r.first_token_s - r.meta.arrival_s for r in reqs if not math.isnan(r.finish_s)]
    return float(np.mean(vals)) if vals else math.nan


def measured(run: Path) -> dict[tuple[str, float], float]:
    with open(run / "summary.csv", newline="") as f:
        return {(r["label"], float(r["offered_rate"])): float(r["attainment"] or 0)
                for r in csv.DictReader(f)}  # fmt: skip


def predict_run(run: Path) -> dict[str, dict]:
    """{label: {"rates", "real", "sim"}} for one run folder."""
    sims = [simulate(p) for p in sorted((run / "requests").glob("*_rate*.jsonl"))]
    real = measured(run)
    out: dict[str, dict] = {}
    for label in sorted({s[0] for s in sims}):
        rows = sorted((rate, reqs) for lab, rate, reqs in sims if lab == label)
        lowest = rows[0][1]
        path_s = max(0.0, mean_ttft(lowest, True) - mean_ttft(lowest, False))
        out[label] = {
            "rates": [r for r, _ in rows],
            "real": [real.get((label, r), math.nan) for r, _ in rows],
            "sim": [attainment(reqs, path_s) for _, reqs in rows],
            "path_s": path_s,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--target", type=float, default=0.9)
    a = p.parse_args(argv)
    print("| run | label | rate | attainment measured | simulated |")
    print("| --- | --- | --- | --- | --- |")
    goodputs: dict[str, list[tuple[float, float]]] = {}
    for run in a.runs:
        for label, d in predict_run(run).items():
            for rate, real, sim in zip(d["rates"], d["real"], d["sim"], strict=True):
                print(f"| {run.name} | {label} | {rate:g} | {real:.3f} | {sim:.3f} |")
            g_real = goodput(d["rates"], d["real"], a.target)
            g_sim = goodput(d["rates"], d["sim"], a.target)
            goodputs.setdefault(label, []).append((g_real.rate, g_sim.rate))
            print(f"| {run.name} | {label} | goodput@{a.target:g} | {g_real.label()} | "
                  f"{g_sim.label()} (path {d['path_s']:.2f} s) |")  # fmt: skip
    print()
    for label, pairs in goodputs.items():
        real, sim = np.array(pairs).T
        print(f"{label}: goodput@{a.target:g} measured {real.mean():.2f} ± {real.std(ddof=1) if len(real) > 1 else 0:.2f}, "
              f"simulated {sim.mean():.2f} ± {sim.std(ddof=1) if len(sim) > 1 else 0:.2f} req/s over {len(pairs)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
