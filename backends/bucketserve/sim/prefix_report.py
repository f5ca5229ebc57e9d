"""The simulator's prefix-caching comparison: placement arms x rates x seeds on the
shared-prefix workload (sim/prefix.py), goodput and per-rate TTFT, hit share and hot-spotting.

    python -m bucketserve.sim.prefix_report [--hot-share 0.6] [--jsonl]

Arms: "no cache" (least loaded, engines without a prefix cache), "least loaded" (engines
cache, placement ignores it), "prefix-aware" (the server's placement: cached overlap vs load,
least loaded past the balance threshold) and "affinity only" (no threshold: pure affinity,
the hot-spotting users of such routers report). Goodput uses the evidence method (a rate
whose backlog grows counts as 0; sim/steady.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

import numpy as np

from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.hardware import GPUS, MODELS
from bucketserve.sim.latency import RooflineLatency
from bucketserve.sim.metrics import effective_attainment, goodput, summarize
from bucketserve.sim.prefix import PrefixWorkload, prefix_requests
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.stats import fmt_ci

ARMS = {  # name -> (placement, balance_tokens, engine prefix cache)
    "no cache": ("least_loaded", 0.0, False),
    "least loaded": ("least_loaded", 0.0, True),
    "prefix-aware": ("prefix_aware", None, True),  # None: ClusterSpec's default threshold
    "affinity only": ("prefix_aware", math.inf, True),
}


def run_arm(arm: str, spec: PrefixWorkload, base: ClusterSpec, latency, policy: str,
            balance_tokens: float | None = None) -> dict:  # fmt: skip
    """One run; `balance_tokens` overrides the prefix-aware arm's threshold."""
    placement, balance, caching = ARMS[arm]
    if arm == "prefix-aware" and balance_tokens is not None:
        balance = balance_tokens
    cluster = replace(base, topology="chunked", placement=placement, prefix_caching=caching)
    if balance is not None:
        cluster = replace(cluster, balance_tokens=balance)
    sim = Simulator(
        policy, prefix_requests(spec), cluster, latency, max_model_len=spec.max_model_len
    )
    m = summarize(sim.run(), "shared-prefix", spec.rate)
    blocks = [w.blocks for w in sim.engine.workers]
    queried = sum(b.num_queried_tokens for b in blocks)
    placed = [sim.router.placed.get(w.instance_id, 0) for w in sim.engine.workers]
    return {
        "arm": arm, "rate": spec.rate, "seed": spec.seed, "requests": m.num_requests,
        "finished": m.finished, "attainment": round(m.attainment, 4),
        "effective_attainment": round(effective_attainment(m), 4), "growing": m.growing,
        "mean_ttft_s": round(m.mean_ttft_s, 4), "p90_ttft_s": round(m.p90_ttft_s, 4),
        "mean_tpot_s": round(m.mean_tpot_s, 4),
        "hit_share": round(sum(b.num_hit_tokens for b in blocks) / queried, 4) if queried else 0.0,
        "evictions": sum(b.num_evictions for b in blocks), "preemptions": m.preemptions,
        "max_instance_share": round(max(placed) / max(sum(placed), 1), 4),
        "holds": sim.router.placement.num_holds,
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bucketserve.sim.prefix_report",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("--rates", default="4,8,12,16,20,24", help="comma-separated req/s")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    p.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals per run")
    p.add_argument("--num-prefixes", type=int, default=8)
    p.add_argument("--prefix-tokens", type=int, default=2048)
    p.add_argument("--hot-share", type=float, default=0.0)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--policy", default="bucketserve")
    p.add_argument("--balance-tokens", type=float, default=None,
                   help="the prefix-aware arm's load-gap threshold (default: the server's)")  # fmt: skip
    p.add_argument("--model", choices=sorted(MODELS), default="llama-2-13b")
    p.add_argument("--gpu", choices=sorted(GPUS), default="a100-40gb")
    p.add_argument("--target", type=float, default=0.9, help="goodput's attainment target")
    p.add_argument("--jsonl", action="store_true", help="also print every run as a JSON line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model, gpu = MODELS[args.model], GPUS[args.gpu]
    try:
        rates = [float(r) for r in args.rates.split(",")]
        base = ClusterSpec.for_hardware(model, gpu, num_aggregated=args.instances,
                                        topology="chunked")  # fmt: skip
        specs = [
            PrefixWorkload(max(1, int(rate * args.duration)), rate, args.num_prefixes,
                           args.prefix_tokens, args.hot_share, 512, model.max_len, seed)
            for rate in rates for seed in args.seeds
        ]  # fmt: skip
    except ValueError as e:
        print(f"bucketserve.sim.prefix_report: {e}", file=sys.stderr)
        return 2
    latency = RooflineLatency(model, gpu)
    print(f"# {latency.describe()}; {args.instances} chunked instances, "
          f"{base.kv_blocks} blocks each; {args.num_prefixes} prefixes x {args.prefix_tokens} "
          f"tokens, hot share {args.hot_share}; policy {args.policy}")  # fmt: skip
    rows = []
    for arm in args.arms:
        for spec in specs:
            rows.append(run_arm(arm, spec, base, latency, args.policy, args.balance_tokens))
            if args.jsonl:
                print(json.dumps(rows[-1]), flush=True)
    print(format_summary(rows, args.target))
    return 0


def format_summary(rows: list[dict], target: float) -> str:
    """Per arm: goodput at `target` (mean ± 95 % CI over seeds), then per rate the means of
    TTFT p90, hit share and the busiest instance's share of requests."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    rates = sorted({r["rate"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"| arm | goodput@{target:g} (req/s) | " + " | ".join(
        f"{rate:g} req/s: p90 TTFT s / hit / top share" for rate in rates) + " |"]  # fmt: skip
    lines.append("| --- " * (2 + len(rates)) + "|")
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        per_seed = []
        for seed in seeds:
            runs = sorted((r for r in mine if r["seed"] == seed), key=lambda r: r["rate"])
            per_seed.append(goodput([r["rate"] for r in runs],
                                    [r["effective_attainment"] for r in runs], target))  # fmt: skip
        cells = []
        for rate in rates:
            at = [r for r in mine if r["rate"] == rate]
            grow = sum(r["growing"] for r in at)
            cells.append(
                f"{np.mean([r['p90_ttft_s'] for r in at]):.2f} / "
                f"{np.mean([r['hit_share'] for r in at]):.2f} / "
                f"{np.mean([r['max_instance_share'] for r in at]):.2f}"
                + (f" ({grow} growing)" if grow else "")
            )
        lines.append(f"| {arm} | {fmt_ci(per_seed)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
