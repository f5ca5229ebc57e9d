"""Policy comparison: static, fcfs, distserve, bucketserve, bucketserve+ on one workload.

Each policy (and each available ablation) gets its own server start of the same build, an
untimed warm-up, then the same seeded requests at every rate of the sweep. Writes
perf/results/<date>-<machine>[-smoke]/ with CSVs, PNG plots, JSONL per request and report.md.

    python perf/load/compare.py --smoke            # CPU scale, a few minutes (make bench-smoke)
    python perf/load/compare.py --rates 0.25,0.5,1 --duration 120 --ablations
"""

from __future__ import annotations

import argparse
import datetime
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bucketserve.bench.ablations import ablation_targets
from bucketserve.bench.arrivals import Arrivals, load_trace
from bucketserve.bench.autorates import AutoRates
from bucketserve.bench.fixed_load import run_fixed_load
from bucketserve.bench.paths import RESULTS
from bucketserve.bench.plots import write_all
from bucketserve.bench.report import write_report, write_summary_csv
from bucketserve.bench.runinfo import context, machine_name
from bucketserve.bench.sweep import SweepPlan, Target, run_sweep
from bucketserve.bench.textsource import TextSource, load_tokenizer
from bucketserve.bench.workloads import build_requests, requests_from_lengths, source, workload

POLICIES = ("static", "fcfs", "distserve", "bucketserve", "bucketserve+")
FIXED_LOAD_POLICY = "bucketserve"  # its server also hosts the loadgen vs perf_analyzer check
PROBE_POLICY = "fcfs"  # with auto rates: the capacity is probed on this policy's server
# the policies compare prefill batching: named, since the server's default is auto (colocated)
DISAGGREGATED = {"topology": "disaggregated"}


@dataclass(slots=True)
class Preset:
    """Defaults of one benchmark size; command-line flags override single fields."""

    workload: str = "mixed"
    profile: str = "cpu"
    input_cap: int = 1500
    rates: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5, 2.0)  # (): fractions of a probed capacity
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    duration_s: float = 120.0
    drain_s: float = 120.0
    max_requests: int = 400
    warmup: int = 4
    fixed_concurrency: int = 2
    fixed_requests: int = 32


SMOKE = Preset(
    input_cap=512,
    rates=(),
    rate_fractions=(0.5, 1.0, 1.5),
    duration_s=10.0,
    drain_s=8.0,
    max_requests=40,
    warmup=2,
    fixed_concurrency=2,
    fixed_requests=10,
)
SLO_BASIS = (
    "The paper states no SLO values; the `paper` profile uses DistServe's (chat 13B-class "
    "0.25 s / 0.1 s, summarisation 15 s / 0.15 s); the `cpu` profile scales them to "
    "SmolLM2-135M on a 2-core CPU with a Bullet-style TTFT normalised per prompt token "
    "(see perf/README.md)."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU-scale preset (a few minutes)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument(
        "--topologies", default="disaggregated",
        help="comma-separated server topologies (disaggregated, colocated, colocatedx2 = two colocated instances, hybrid = two hybrid instances with adaptive roles): each policy runs "
        "in each; labels become policy@topology when more than one",
    )  # fmt: skip
    p.add_argument(
        "--chunk-tokens", type=int, default=0, help="colocated: tokens/iteration (0: auto)"
    )
    p.add_argument(
        "--dtypes", default="",
        help="comma-separated server dtypes (float32, bfloat16; empty: the server's auto): each "
        "policy runs with each; labels gain @dtype when more than one",
    )  # fmt: skip
    p.add_argument("--workload", choices=("alpaca", "longbench", "mixed", "phased", "sharegpt"))
    p.add_argument("--profile", choices=("paper", "cpu"))
    p.add_argument("--input-cap", type=int, help="prompt truncation (tokens)")
    p.add_argument(
        "--tpot-slo-ms", type=float,
        help="one TPOT SLO for every request instead of its source's (sent with each request)",
    )  # fmt: skip
    p.add_argument("--arrival", default="poisson", choices=("poisson", "gamma", "trace"))
    p.add_argument("--cv", type=float, default=2.0, help="Gamma CV (bursty arrivals)")
    p.add_argument(
        "--trace", help="CSV timestamp,input_length,output_length (with --arrival trace)"
    )
    p.add_argument("--rates", help="comma-separated request rates (req/s), or 'auto'")
    p.add_argument("--rate-fractions", help="with --rates auto: fractions of probed capacity")
    p.add_argument("--duration", type=float, help="send window per rate (s)")
    p.add_argument("--drain", type=float, help="wait for running requests after it (s)")
    p.add_argument("--max-requests", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ablations", action="store_true", help="also run the BucketServe ablations")
    p.add_argument("--skip-fixed-load", action="store_true", help="skip loadgen vs perf_analyzer")
    p.add_argument("--fixed-concurrency", type=int)
    p.add_argument("--fixed-requests", type=int)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def resolve_preset(a: argparse.Namespace) -> Preset:
    pre = SMOKE if a.smoke else Preset()
    over = {
        "workload": a.workload,
        "profile": a.profile,
        "input_cap": a.input_cap,
        "rates": _floats(a.rates) if a.rates else None,
        "rate_fractions": _floats(a.rate_fractions) if a.rate_fractions else None,
        "duration_s": a.duration,
        "drain_s": a.drain,
        "max_requests": a.max_requests,
        "warmup": a.warmup,
        "fixed_concurrency": a.fixed_concurrency,
        "fixed_requests": a.fixed_requests,
    }
    return replace(pre, **{k: v for k, v in over.items() if v is not None})


def _floats(text: str) -> tuple[float, ...]:
    return () if text == "auto" else tuple(float(x) for x in text.split(","))


def make_requests(a: argparse.Namespace, pre: Preset, text: TextSource):
    """(requests, unit-rate send times, arrival, workload lines, SLO lines)."""
    n = pre.max_requests + pre.warmup
    if a.arrival == "trace":
        if not a.trace:
            raise SystemExit("--arrival trace needs --trace FILE")
        tr = load_trace(a.trace)
        lengths = list(zip(tr.input_lengths.tolist(), tr.output_lengths.tolist(), strict=True))
        slo = source("alpaca", pre.profile, pre.input_cap)
        reqs = requests_from_lengths(lengths, a.seed, text, slo)
        arr = Arrivals("trace", trace=tr)
        lines = [f"trace {a.trace}: {len(reqs)} requests, lengths from the trace; SLOs of alpaca"]
        return (
            reqs,
            arr.send_times(len(reqs), 1.0, a.seed),
            arr.describe(),
            lines,
            [f"trace: {slo.describe_slo()}"],
        )
    wl = workload(pre.workload, pre.profile, pre.input_cap)
    arr = Arrivals(a.arrival, cv=a.cv if a.arrival == "gamma" else 1.0)
    reqs = build_requests(wl, n, a.seed, text)
    slo_lines = [f"{src.name}: {src.describe_slo()}" for src in wl.sources]
    if a.tpot_slo_ms:
        reqs = [replace(r, tpot_slo_s=a.tpot_slo_ms / 1e3) for r in reqs]
        slo_lines.append(f"TPOT SLO of every request: {a.tpot_slo_ms:g} ms (--tpot-slo-ms)")
    return reqs, arr.send_times(n, 1.0, a.seed), arr.describe(), wl.describe(), slo_lines


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    pre = resolve_preset(a)
    signal.signal(signal.SIGTERM, _exit_on_term)  # stop the running server cleanly
    t_start = time.perf_counter()
    date = datetime.date.today().isoformat()
    out = a.out or RESULTS / f"{date}-{machine_name()}{'-smoke' if a.smoke else ''}"
    out.mkdir(parents=True, exist_ok=True)
    text = TextSource.build(load_tokenizer())
    reqs, unit_times, arrival, wl_lines, slo_lines = make_requests(a, pre, text)
    plan = SweepPlan(
        pre.rates, pre.duration_s, pre.drain_s, pre.max_requests, pre.warmup, seed=a.seed
    )
    targets, abl_notes = select_targets(a, pre)
    hook = None if a.skip_fixed_load else fixed_load_hook(text, pre, out, a.seed)
    auto = AutoRates(pre.rate_fractions, reqs)
    results = [
        run_sweep(
            t, reqs, unit_times, plan, out, hook if t.label == FIXED_LOAD_POLICY else None, auto
        )
        for t in targets
    ]
    ctx = context(a, pre, date, len(reqs), time.perf_counter() - t_start)
    rates = ", ".join(
        f"{r:g}" for r in sorted({s.offered_rate for x in results for s in x.summaries})
    )
    ctx.update(arrival=arrival, workload_lines=wl_lines, slo_lines=slo_lines, slo_basis=SLO_BASIS,
               rates=rates if pre.rates else f"{rates} ({auto.describe()})")  # fmt: skip
    write_outputs(out, ctx, results, abl_notes)
    return 0


def select_targets(a: argparse.Namespace, pre: Preset) -> tuple[list[Target], list[str]]:
    """Policies, ablations if asked, the fixed-load host; probe policy first with auto rates."""
    topologies = [t for t in a.topologies.split(",") if t]
    dtypes = [d for d in a.dtypes.split(",") if d] or [""]
    targets = [
        Target(p + ("" if topologies == ["disaggregated"] else f"@{t}")
               + (f"@{d}" if len(dtypes) > 1 else ""), p,
               topology_overrides(t, a) | ({"dtype": d} if d else {}))
        for p in a.policies.split(",") if p for t in topologies for d in dtypes
    ]  # fmt: skip
    abl_targets, abl_notes = ablation_targets()
    if a.ablations:  # the components they switch off work on prefill batches: P/D
        targets += [Target(t.label, t.policy, DISAGGREGATED | t.overrides) for t in abl_targets]
    else:
        abl_notes = ["Not requested (run with --ablations).", "", *abl_notes]
    if not a.skip_fixed_load and FIXED_LOAD_POLICY not in [t.label for t in targets]:
        targets.append(Target(FIXED_LOAD_POLICY, FIXED_LOAD_POLICY, DISAGGREGATED))  # fixed load
    if not pre.rates:  # the capacity probe runs on the first server: the vLLM-like baseline
        targets.sort(key=lambda t: t.label != PROBE_POLICY)
    return targets, abl_notes


def topology_overrides(topology: str, a: argparse.Namespace) -> dict:
    """ServeConfig overrides of one --topologies entry: "disaggregated", "colocated",
    "colocatedxN" (N colocated CPU instances, the cores split among them), or "hybrid" (an
    instance per device of both roles, adaptive roles)."""
    name, _, count = topology.partition("x")
    if name == "disaggregated":  # named: the server's default is auto (colocated)
        return dict(DISAGGREGATED)
    over = {"topology": name, "chunk_tokens": a.chunk_tokens}
    if count:
        over["decode_devices"] = ["cpu"] * int(count)
    return over


def write_outputs(out: Path, ctx: dict, results: list, abl_notes: list[str]) -> None:
    fixed = next((r.extra for r in results if r.extra is not None), None)
    write_summary_csv(results, out / "summary.csv")
    write_report(out / "report.md", ctx, results, fixed, write_all(results, out), abl_notes)
    print(f"report: {out / 'report.md'} ({ctx['wall_s']:.0f} s)")


def _exit_on_term(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def fixed_load_hook(text: TextSource, pre: Preset, out: Path, seed: int):
    """Run on the bucketserve server after its sweep: loadgen, perf_analyzer, genai-perf."""

    def hook(srv):
        return run_fixed_load(srv, text, pre.fixed_concurrency, pre.fixed_requests, out, seed)

    return hook


if __name__ == "__main__":
    sys.exit(main())
