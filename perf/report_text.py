"""Prose sections of the report: setup (workload, SLOs, arrivals) and the fixed-load check."""

from __future__ import annotations

import math

import numpy as np
from fixed_load import FixedLoadResult
from sweep import SweepResult

PA_LATENCY_NOTE = (
    "perf_analyzer's own `Avg latency` for a decoupled model is the time to the *last* response "
    "of each request (checked against its profile export), although its log says it uses the "
    "first response; its `Inferences/Second` counts requests completed inside its measurement "
    "window. The rows above are computed from its per-response timestamps with our code."
)


def header_section(ctx: dict, results: list[SweepResult]) -> list[str]:
    starts = ", ".join(f"{r.target.label} {r.start_s:.0f} s" for r in results)
    return [
        f"# BucketServe policy comparison — {ctx['date']} on {ctx['machine']}",
        "",
        f"Server build: git `{ctx['commit']}`; model {ctx['model']} on CPU; every target below is "
        f"a fresh server start of this same build. Command: `{ctx['command']}`.",
        "",
        "## Setup",
        "",
        f"* **Workload** `{ctx['workload']}` (profile `{ctx['profile']}`, seed {ctx['seed']}, "
        f"{ctx['num_requests']} requests generated; the same list, in the same order, for every "
        "target and rate):",
        *[f"  * {line}" for line in ctx["workload_lines"]],
        "* **Output length** enforced with min_tokens = max_tokens = the drawn length; greedy.",
        f"* **Prompts**: {ctx['corpus']}",
        "* **SLOs** per request source (a request attains its SLO when TTFT <= TTFT SLO and "
        "TPOT <= TPOT SLO; failed or unfinished requests count as misses): "
        + "; ".join(ctx["slo_lines"])
        + ". "
        + ctx["slo_basis"],
        f"* **Arrival process**: {ctx['arrival']}; one seeded unit-rate sequence of send times "
        "divided by each rate.",
        f"* **Rates** (req/s): {', '.join(f'{r:g}' for r in ctx['rates'])}; each rate sends for "
        f"{ctx['duration_s']:g} s (at most {ctx['max_requests']} requests), then waits up to "
        f"{ctx['drain_s']:g} s for running requests (still running after that: counted as failed).",
        f"* **Warm-up**: {ctx['warmup']} requests per server start, untimed.",
        "* **Client**: perf/loadgen.py, asyncio gRPC streaming (one stream per request), the "
        "ensemble model `bucketserve`; TTFT = send to first token, TPOT = (last token - first "
        "token) / (tokens - 1), ITL = gaps between token-bearing responses spread over their tokens.",
        f"* **Server start times**: {starts}. Total wall time {ctx['wall_s']:.0f} s.",
        f"* **Host**: {ctx['host_note']}",
        "",
    ]


def _mean_se(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    se = float(np.std(xs, ddof=1) / math.sqrt(len(xs))) if len(xs) > 1 else math.inf
    return float(np.mean(xs)), se


def _noise_verdict(a: list[float], b: list[float]) -> str:
    (ma, sa), (mb, sb) = _mean_se(a), _mean_se(b)
    se = math.sqrt(sa**2 + sb**2)
    z = abs(mb - ma) / se if se > 0 else math.inf
    verdict = "within sampling noise" if z < 2 else "larger than sampling noise"
    return f"{verdict}: difference {mb - ma:+.3f} s vs combined standard error {se:.3f} s (z = {z:.1f}, n = {len(a)}/{len(b)})"


def fixed_load_section(fx: FixedLoadResult | None, tol: float) -> list[str]:
    lines = ["## Our load generator vs perf_analyzer at the same fixed load", ""]
    if fx is None:
        return lines + ["Not run (--skip-fixed-load).", ""]
    lines.append(
        f"Closed loop, concurrency {fx.concurrency}, the same {fx.requests} requests in the "
        "same order, back to back on the same server (loadgen first)."
    )
    if fx.pa is None:
        return lines + ["", f"perf_analyzer did not complete: `{fx.pa_error}`", ""]
    lines += ["", "| metric | loadgen | perf_analyzer | difference |", "|---|---|---|---|"]
    diffs = fx.differences()
    for name, label in (
        ("served_rate", "throughput (req/s)"),
        ("output_tok_s", "output tokens/s"),
        ("ttft_mean", "TTFT mean (s)"),
        ("ttft_p50", "TTFT p50 (s)"),
        ("tpot_mean", "TPOT mean (s)"),
        ("e2e_p50", "end-to-end p50 (s)"),
    ):
        a, b = getattr(fx.ours, name), getattr(fx.pa, name)
        d = f"{diffs[name]:+.1%}" if name in diffs else "-"
        lines.append(
            f"| {label} | {a:.4g} | {b:.4g} | {d} |" if a and b else f"| {label} | {a} | {b} | - |"
        )
    rep = fx.pa_reported or {}
    if rep:
        lines.append(
            f"| perf_analyzer's own report | | {rep.get('Inferences/Second')} infer/s, "
            f"avg latency {float(rep.get('Avg latency', 'nan')) / 1e6:.3f} s | |"
        )
    lines += ["", PA_LATENCY_NOTE, "", *_explain(fx, diffs, tol), ""]
    return lines


def _explain(fx: FixedLoadResult, diffs: dict[str, float], tol: float) -> list[str]:
    big = {k: v for k, v in diffs.items() if k in ("served_rate", "ttft_mean") and abs(v) > tol}
    if not big:
        return [f"Throughput and mean TTFT agree within {tol:.0%}."]
    out = [f"Differences above {tol:.0%}:"]
    if "ttft_mean" in big:
        out.append(
            f"* mean TTFT {big['ttft_mean']:+.1%}: {_noise_verdict(fx.ours_ttft, fx.pa_ttft)}."
        )
    if "served_rate" in big:
        out.append(
            f"* throughput {big['served_rate']:+.1%}: in a closed loop throughput = concurrency / "
            f"mean end-to-end latency, so it moves with the end-to-end time — "
            f"{_noise_verdict(fx.ours_e2e, fx.pa_e2e)}; the two runs are sequential on a shared host "
            "whose load changed between them (see load average in the table above)."
        )
    return out
