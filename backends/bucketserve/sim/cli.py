"""`bucketserve simulate`: sweep policies x request rates in the discrete-event simulator.

Defaults (Llama-2-13B on 4 x A100-40GB, roofline latency, Mixed and Alpaca, 60 s of arrivals
and at least 300 requests per run, the five server policies, one seed) finish in about a
minute on two cores and are deterministic per seed. Goodput uses the evidence method
(sim/steady.py: a rate whose backlog grows counts as 0, the last third of a run counts);
`--seeds K` repeats every run for K seeds and adds mean ± 95 % CI. The full method (fixed
grid, 5 seeds, 300 s runs, every system) is `python -m bucketserve.sim.evidence`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bucketserve.scheduling import POLICIES, SIM_POLICIES
from bucketserve.sim.cluster import TOPOLOGIES, ClusterSpec
from bucketserve.sim.hardware import GPUS, MODELS
from bucketserve.sim.latency import FittedLatency, RooflineLatency
from bucketserve.sim.report import format_goodput, format_table, goodput_rows, plot, write_csv
from bucketserve.sim.runner import Sweep, expand_policies, parse_rates
from bucketserve.sim.workload import ARRIVALS, WORKLOADS, WorkloadSpec

DEFAULT_RATES = "1,2,4,6,8,12,16,24"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bucketserve simulate", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="seeds seed..seed+K-1 (CIs when K > 1)")
    p.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="repeatable (default: mixed and alpaca)",
    )
    p.add_argument(
        "--policy",
        action="append",
        help=f"repeatable, comma lists or 'all' (the server's five); any of {', '.join(SIM_POLICIES)}",
    )
    p.add_argument("--rates", default=DEFAULT_RATES, help="comma-separated request rates (req/s)")
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="at least rate x duration requests per run (0: off)",
    )
    p.add_argument("--out", type=Path, default=None, help="directory for CSV and PNG files")
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson")
    p.add_argument("--cv", type=float, default=2.0, help="Gamma arrivals' coefficient of variation")
    p.add_argument(
        "--long-fraction", type=float, default=0.1, help="Mixed: share of LongBench-like requests"
    )
    p.add_argument("--slo-class", choices=("online", "offline"), default="online")
    p.add_argument(
        "--offline-fraction", type=float, default=0.0,
        help="share of offline requests, the rest online (overrides --slo-class when > 0)",
    )  # fmt: skip
    p.add_argument(
        "--scheduler", type=json.loads, default=None, metavar="JSON",
        help='SchedulerConfig overrides, e.g. \'{"enable_bucketing": false}\' (ablations)',
    )  # fmt: skip
    add_cluster_args(p)
    return p


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Model, GPU, instance counts and the latency model."""
    p.add_argument("--model", choices=sorted(MODELS), default="llama-2-13b")
    p.add_argument("--gpu", choices=sorted(GPUS), default="a100-40gb")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--prefill", type=int, default=2, help="prefill instances (P/D policies)")
    p.add_argument("--decode", type=int, default=2, help="decode instances (P/D policies)")
    p.add_argument("--aggregated", type=int, default=4, help="instances for static / fcfs")
    p.add_argument("--topology", choices=TOPOLOGIES, default="auto")
    p.add_argument(
        "--padded-prefill", action="store_true", help="charge prefill for N x longest prompt"
    )
    p.add_argument(
        "--latency-jsonl", type=Path, default=None, help="fit latency to engine_bench JSON lines"
    )
    p.add_argument("--impl", default=None, help="engine_bench 'impl' to fit (with --latency-jsonl)")


def build_sweeps(args: argparse.Namespace) -> list[Sweep]:
    model, gpu = MODELS[args.model], GPUS[args.gpu]
    cluster = ClusterSpec.for_hardware(
        model, gpu, args.tp, num_prefill=args.prefill, num_decode=args.decode,
        num_aggregated=args.aggregated, topology=args.topology, padded_prefill=args.padded_prefill,
    )  # fmt: skip
    if args.latency_jsonl is not None:
        latency = FittedLatency.from_jsonl(
            args.latency_jsonl, model.kv_bytes_per_token, impl=args.impl
        )
    else:
        latency = RooflineLatency(model, gpu, args.tp)
    policies = expand_policies(args.policy or ["all"], POLICIES, SIM_POLICIES)
    rates = parse_rates(args.rates)
    sweeps = []
    for name in args.workload or ["mixed", "alpaca"]:
        spec = WorkloadSpec(
            name, args.num_requests, rates[0], args.arrival, args.cv, args.long_fraction,
            model.max_len, min(512, model.max_len // 2), args.slo_class, args.seed,
            args.offline_fraction,
        )  # fmt: skip
        sweep = Sweep(spec, policies, rates, cluster, latency, args.scheduler, args.duration)
        sweep.config_for()  # bad --scheduler overrides fail here, before any run
        sweeps.append(sweep)
    return sweeps


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweeps = build_sweeps(args)
    except ValueError as e:
        print(f"bucketserve simulate: {e}", file=sys.stderr)
        return 2
    print(
        f"# {sweeps[0].latency.describe()}; KV pool {sweeps[0].cluster.kv_blocks} blocks/instance"
    )
    rows = [row for sweep in sweeps for row in sweep.run()]
    for k in range(1, args.seeds):
        for sweep in sweeps:
            rows += sweep.with_seed(args.seed + k).run()
    print(format_table(rows))
    good = goodput_rows(rows)
    print()
    print(format_goodput(good))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv([r.as_dict() for r in rows], args.out / "results.csv")
        write_csv(good, args.out / "goodput.csv")
        for path in plot(rows, args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
