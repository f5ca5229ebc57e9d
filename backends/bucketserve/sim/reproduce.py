"""Paper-scale reproduction in simulation: Llama-2-13B on 4 x A100-40GB (roofline latency).

    python -m bucketserve.sim.reproduce --out perf/results/sim/paper

Online sweeps (Alpaca, Mixed) for all policies, offline throughput (Mixed, every request
queued at t=0), server load capacity, scheduler overhead at 32 req/s, and sensitivity runs on
Mixed for the P/D policies (padded prefill, 1P3D placement, bursty Gamma arrivals).
Writes CSV, PNG and summary.json under --out.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from bucketserve.scheduling import POLICIES, SchedulerConfig
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import A100_40GB, LLAMA2_13B
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import summarize
from bucketserve.sim.overhead import measure
from bucketserve.sim.report import format_goodput, format_table, goodput_rows, plot, write_csv
from bucketserve.sim.runner import Sweep
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests

RATES = {"mixed": (1, 2, 3, 4, 5, 6, 8, 10), "alpaca": (2, 4, 8, 12, 16, 20, 24, 28, 32)}
PD_POLICIES = ("distserve", "bucketserve", "bucketserve+")


def _progress(row) -> None:
    print(
        f"  {row.workload:7s} {row.policy:13s} {row.rate:5.1f} attain={row.attainment:.3f} served={row.served_rate:.2f}",
        flush=True,
    )


def online(
    ctx, out: Path, tag: str = "", policies=POLICIES, workloads=tuple(RATES), **wl
) -> list[dict]:
    """Sweep rates; write online{tag}.csv and goodput{tag}.csv; return the goodput rows."""
    cluster, latency, seed, duration = ctx
    rows = []
    for name in workloads:
        spec = WorkloadSpec(name, 300, RATES[name][0], seed=seed, **wl)
        rows += Sweep(spec, policies, RATES[name], cluster, latency, duration_s=duration).run(
            _progress
        )
    write_csv([r.as_dict() for r in rows], out / f"online{tag}.csv")
    good = goodput_rows(rows)
    write_csv(good, out / f"goodput{tag}.csv")
    if not tag:
        plot(rows, out)
    print(format_table(rows), format_goodput(good), sep="\n\n", flush=True)
    return good


def offline(ctx, n: int) -> dict[str, float]:
    """Every request queued at once (offline class): output tokens/s until the last finishes."""
    cluster, latency, seed, _ = ctx
    spec = WorkloadSpec("mixed", n, 1e6, seed=seed, slo_class="offline")
    result = {}
    for policy in POLICIES:
        m = summarize(
            Simulator(policy, make_requests(spec), cluster, latency).run(), "mixed", spec.rate
        )
        result[policy] = round(m.throughput_tok_s, 1)
    print("offline throughput (tok/s):", result, flush=True)
    return result


OVERHEAD_VARIANTS = (
    [("bucketserve", f"cap{k}", {"bucket_cap": k}) for k in (1, 2, 4, 8)]
    + [("bucketserve", "uncapped", {}), ("bucketserve+", "max8", {"max_buckets": 8})]
)  # fmt: skip


def overhead(ctx, seconds: float = 60.0) -> list[dict]:
    """Decision cost at 32 req/s: faithful bucketserve with Algorithm 1 capped at 1/2/4/8
    buckets (the paper measured 1-8) and uncapped, and bucketserve+; share of GPU and wall time."""
    cluster, latency, seed, _ = ctx
    rows = []
    for name in ("mixed", "alpaca"):
        spec = WorkloadSpec(name, int(32 * seconds), 32.0, seed=seed)
        for policy, variant, kw in OVERHEAD_VARIANTS:
            cfg = SchedulerConfig(
                max_model_len=4096,
                block_size=cluster.block_size,
                max_num_seqs=cluster.max_num_seqs,
                **kw,
            )
            sim = Simulator(policy, make_requests(spec), cluster, latency, cfg)
            rows.append({"workload": name, "variant": variant} | asdict(measure(sim.run(), 32.0)))
            r = rows[-1]
            print(
                f"  {name:7s} {policy:13s} {variant:9s} {r['mean_us']:7.1f} us/decision, {100 * r['share_of_gpu_time']:.3f} % of GPU time, max {r['max_buckets']} buckets",
                flush=True,
            )
    return rows


def sensitivity(ctx, out: Path) -> dict[str, list[dict]]:
    cluster, latency, seed, duration = ctx
    runs = {
        "padded_prefill": ((replace(cluster, padded_prefill=True), latency, seed, duration), {}),
        "1p3d": ((replace(cluster, num_prefill=1, num_decode=3), latency, seed, duration), {}),
        "gamma_cv2": (ctx, {"arrival": "gamma", "cv": 2.0}),
    }
    return {
        tag: online(c, out, f"_{tag}", PD_POLICIES, ("mixed",), **wl)
        for tag, (c, wl) in runs.items()
    }


ABLATIONS = {
    "plus-no-expected-reserve": {"output_reserve": "none"},
    "plus-one-bucket": {"max_buckets": 1},
    "plus-edf-only": {"output_reserve": "none", "max_buckets": 1},
}


def ablation(ctx, out: Path) -> list[dict]:
    """bucketserve+ with one change at a time undone, Mixed, Poisson."""
    cluster, latency, seed, duration = ctx
    spec = WorkloadSpec("mixed", 300, 1.0, seed=seed)
    rows = []
    for label, kw in ABLATIONS.items():
        sweep = Sweep(spec, ("bucketserve+",), RATES["mixed"], cluster, latency, kw, duration)
        rows += [replace(r, policy=label) for r in sweep.run(_progress)]
    write_csv([r.as_dict() for r in rows], out / "online_ablation.csv")
    good = goodput_rows(rows)
    write_csv(good, out / "goodput_ablation.csv")
    print(format_goodput(good), flush=True)
    return good


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("perf/results/sim/paper"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--duration", type=float, default=120.0, help="seconds of arrivals per online run"
    )
    p.add_argument("--offline-requests", type=int, default=2000)
    p.add_argument("--skip-sensitivity", action="store_true")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    latency = RooflineLatency(LLAMA2_13B, A100_40GB)
    cluster = ClusterSpec.for_hardware(LLAMA2_13B, A100_40GB)  # 2P2D for P/D, 4 for aggregated
    ctx = (cluster, latency, args.seed, args.duration)
    t0 = time.perf_counter()
    summary = {"latency_model": latency.describe(), "kv_blocks_per_instance": cluster.kv_blocks}
    summary["goodput"] = online(ctx, args.out)
    summary["offline_tok_s"] = offline(ctx, args.offline_requests)
    summary["overhead_32rps"] = overhead(ctx)
    if not args.skip_sensitivity:
        summary["sensitivity"] = sensitivity(ctx, args.out)
        summary["ablation"] = ablation(ctx, args.out)
        summary["offline_tok_s_padded"] = offline(
            (replace(cluster, padded_prefill=True), *ctx[1:]), args.offline_requests
        )
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out} in {summary['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
