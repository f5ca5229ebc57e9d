"""Paper-scale reproduction in simulation: Llama-2-13B on 4 x A100-40GB (roofline latency).

    python -m bucketserve.sim.reproduce --out perf/results/sim/paper

Online sweeps (Alpaca, Mixed) for all policies, offline throughput (Mixed, every request
queued at t=0), server load capacity, scheduler overhead at 32 req/s, and sensitivity runs
(padded prefill, 1P3D placement, bursty arrivals). Writes CSV, PNG and summary.json.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from bucketserve.scheduling import POLICIES
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import summarize
from bucketserve.sim.overhead import measure
from bucketserve.sim.report import format_goodput, format_table, goodput_rows, plot, write_csv
from bucketserve.sim.runner import Sweep
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests

RATES = {
    "mixed": (1, 2, 3, 4, 5, 6, 7, 8, 10, 12),
    "alpaca": (2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32),
}


def online(
    cluster, latency, seed: int, duration: float, out: Path, tag: str = "", **wl
) -> list[dict]:
    rows = []
    for name, rates in RATES.items():
        spec = WorkloadSpec(name, 300, rates[0], seed=seed, **wl)
        rows += Sweep(spec, POLICIES, rates, cluster, latency, duration_s=duration).run()
    write_csv([r.as_dict() for r in rows], out / f"online{tag}.csv")
    good = goodput_rows(rows)
    write_csv(good, out / f"goodput{tag}.csv")
    if not tag:
        plot(rows, out)
    print(format_table(rows), format_goodput(good), sep="\n\n", flush=True)
    return good


def offline(cluster, latency, seed: int, n: int) -> dict[str, float]:
    """Every request queued at once (offline class): output tokens/s until the last finishes."""
    spec = WorkloadSpec("mixed", n, 1e6, seed=seed, slo_class="offline")
    result = {}
    for policy in POLICIES:
        m = summarize(
            Simulator(policy, make_requests(spec), cluster, latency).run(), "mixed", spec.rate
        )
        result[policy] = round(m.throughput_tok_s, 1)
    print("offline throughput (tok/s):", result, flush=True)
    return result


def overhead(cluster, latency, seed: int, duration: float) -> list[dict]:
    rows = []
    for name in ("mixed", "alpaca"):
        spec = WorkloadSpec(name, int(32 * duration), 32.0, seed=seed)
        for policy in ("bucketserve", "bucketserve+"):
            sim = Simulator(policy, make_requests(spec), cluster, latency)
            rows.append({"workload": name} | asdict(measure(sim.run(), 32.0)))
    print(json.dumps(rows, indent=1), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("perf/results/sim/paper"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--duration", type=float, default=240.0, help="seconds of arrivals per online run"
    )
    p.add_argument("--offline-requests", type=int, default=2000)
    p.add_argument("--skip-sensitivity", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    latency = RooflineLatency(LLAMA2_13B, A100_40GB)
    cluster = ClusterSpec.for_hardware(LLAMA2_13B, A100_40GB)  # 2P2D for P/D, 4 for aggregated
    summary = {"latency_model": latency.describe(), "kv_blocks_per_instance": cluster.kv_blocks}
    summary["goodput"] = online(cluster, latency, args.seed, args.duration, args.out)
    summary["offline_tok_s"] = offline(cluster, latency, args.seed, args.offline_requests)
    summary["overhead_32rps"] = overhead(cluster, latency, args.seed, 60.0)
    if not args.skip_sensitivity:
        summary["goodput_padded"] = online(
            replace(cluster, padded_prefill=True),
            latency,
            args.seed,
            args.duration,
            args.out,
            "_padded",
        )
        summary["goodput_1p3d"] = online(
            replace(cluster, num_prefill=1, num_decode=3),
            latency,
            args.seed,
            args.duration,
            args.out,
            "_1p3d",
        )
        summary["goodput_bursty"] = online(
            cluster,
            latency,
            args.seed,
            args.duration,
            args.out,
            "_gamma_cv2",
            arrival="gamma",
            cv=2.0,
        )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
