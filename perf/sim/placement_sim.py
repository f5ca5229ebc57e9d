"""Simulated placement study: 1P1D vs 1P2D vs 2P2D, and decode balancing rr / least / max–min.

Same scheduler code as the server (policy bucketserve, scheduling/placement.py), Llama-2-13B
on A100-40GB roofline latency, Mixed workload, several seeds (common random numbers: every
configuration sees the same request lists). Prints a Markdown table of mean ± 95 % CI (Student t) over seeds.

    nice -n 10 .venv/bin/python perf/sim/placement_sim.py --seeds 0,1,2 --rates 2,4
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

from bucketserve.scheduling import SchedulerConfig
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import GPUS, MODELS
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import summarize
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.stats import mean_ci
from bucketserve.sim.workload import WorkloadSpec, make_requests

TOPOLOGIES = {"1P1D": (1, 1), "1P2D": (1, 2), "2P2D": (2, 2)}
BALANCES = ("round_robin", "least_loaded", "maxmin")
COLUMNS = ("attainment", "p90_ttft_s", "p90_tpot_s", "throughput_tok_s", "preemptions")


def run(topology: str, balance: str, rate: float, seed: int, args) -> dict:
    model, gpu = MODELS["llama-2-13b"], GPUS["a100-40gb"]
    num_prefill, num_decode = TOPOLOGIES[topology]
    cluster = ClusterSpec.for_hardware(model, gpu, num_prefill=num_prefill, num_decode=num_decode)
    cluster = replace(cluster, kv_blocks=int(cluster.kv_blocks * args.kv_scale))
    spec = WorkloadSpec("mixed", args.num_requests, rate, "gamma", 2.0, 0.1, model.max_len,
                        min(512, model.max_len // 2), "online", seed)  # fmt: skip
    cfg = SchedulerConfig(max_model_len=model.max_len, block_size=cluster.block_size,
                          max_num_seqs=cluster.max_num_seqs, decode_balance=balance)  # fmt: skip
    sim = Simulator("bucketserve", make_requests(spec), cluster, RooflineLatency(model, gpu), cfg)
    return summarize(sim.run(), "mixed", rate).as_dict()


def cell(values: list[float], column: str) -> str:
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        return f"n/a ({sum(not math.isfinite(v) for v in values)} runs without a value)"
    mean, spread = mean_ci(values)
    spread = 0.0 if math.isnan(spread) else spread
    if column == "attainment":
        return f"{100 * mean:.1f} ± {100 * spread:.1f} %"
    if column in ("p90_ttft_s", "p90_tpot_s"):
        return f"{mean:.3f} ± {spread:.3f}"
    return f"{mean:.0f} ± {spread:.0f}"


def table(rows: list[tuple[str, str, float, list[dict]]]) -> str:
    head = "| topology | decode balance | rate (req/s) | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (3 + len(COLUMNS))]
    for topology, balance, rate, runs in rows:
        cells = [cell([r[c] for r in runs], c) for c in COLUMNS]
        lines.append(f"| {topology} | {balance} | {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rates", default="2,4")
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument("--kv-scale", type=float, default=1.0, help="shrink KV pools (pressure)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    plan = [(t, "maxmin") for t in TOPOLOGIES] + [("1P2D", b) for b in BALANCES[:2]]
    plan += [("2P2D", b) for b in BALANCES[:2]]
    rows = []
    for topology, balance in plan:
        for rate in rates:
            runs = [run(topology, balance, rate, seed, args) for seed in seeds]
            rows.append((topology, balance, rate, runs))
            print(f"done {topology} {balance} rate {rate}", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (r[2], r[0], r[1]))
    print(f"seeds {seeds}, {args.num_requests} requests per run, kv scale {args.kv_scale}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
