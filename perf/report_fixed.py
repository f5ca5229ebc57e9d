"""Report section: our load generator vs perf_analyzer vs genai-perf at the same fixed load."""

from __future__ import annotations

import math

import numpy as np
from fixed_load import INPUT_TOKENS, OUTPUT_TOKENS, FixedLoadResult

ROWS = (  # (RunSummary field, label, genai-perf metric, statistic, scale to seconds or 1)
    ("served_rate", "throughput (req/s)", "Request Throughput (per sec)", "value", 1.0),
    ("output_tok_s", "output tokens/s", "Output Token Throughput (tokens/sec)", "value", 1.0),
    ("ttft_mean", "TTFT mean (s)", "Time To First Token (ms)", "avg", 1e-3),
    ("ttft_p50", "TTFT p50 (s)", "Time To First Token (ms)", "p50", 1e-3),
    ("tpot_mean", "TPOT / ITL mean (s)", "Inter Token Latency (ms)", "avg", 1e-3),
    ("e2e_p50", "end-to-end p50 (s)", "Request Latency (ms)", "p50", 1e-3),
)
NOTES = (
    "perf_analyzer's own `Avg latency` for a decoupled model is the time to the *last* response "
    "of each request (checked against its profile export) although its log says it uses the "
    "first response; its `Inferences/Second` counts requests completed in its measurement "
    "window. Its column is computed from its per-response timestamps with our code. genai-perf's "
    "column is its own CSV; it counts output tokens by re-tokenising the streamed text, so its "
    "token throughput can read a little lower."
)


def _genai_value(fx: FixedLoadResult, metric: str, stat: str, scale: float) -> float | None:
    v = (fx.genai or {}).get(metric, {}).get(stat)
    return None if v is None else v * scale


def _cell(v: float | None, ref: float | None) -> tuple[str, str]:
    if v is None:
        return "-", "-"
    diff = f"{(v - ref) / ref:+.1%}" if ref else "-"
    return f"{v:.4g}", diff


def table(fx: FixedLoadResult) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Markdown rows and the relative differences {(tool, field): diff} vs ours."""
    lines = ["| metric | loadgen | perf_analyzer | diff | genai-perf | diff |", "|---" * 6 + "|"]
    diffs = {}
    for name, label, metric, stat, scale in ROWS:
        ours = getattr(fx.ours, name)
        pa = getattr(fx.pa, name) if fx.pa else None
        gp = _genai_value(fx, metric, stat, scale)
        for tool, v in (("perf_analyzer", pa), ("genai-perf", gp)):
            if v is not None and ours:
                diffs[(tool, name)] = (v - ours) / ours
        cells = [*_cell(pa, ours), *_cell(gp, ours)]
        lines.append(
            f"| {label} | {'-' if ours is None else f'{ours:.4g}'} | {' | '.join(cells)} |"
        )
    return lines, diffs


def _noise(a: list[float], b: list[float]) -> str:
    if len(a) < 2 or len(b) < 2:
        return "too few samples to test against noise"
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    d = float(np.mean(b) - np.mean(a))
    z = abs(d) / se if se > 0 else math.inf
    verdict = "within sampling noise" if z < 2 else "larger than sampling noise"
    return f"{verdict} (difference {d:+.3f} s, standard error {se:.3f} s, z = {z:.1f}, n = {len(a)}/{len(b)})"


def explain(fx: FixedLoadResult, diffs: dict, tol: float) -> list[str]:
    big = {k: v for k, v in diffs.items() if k[1] in ("served_rate", "ttft_mean") and abs(v) > tol}
    if not big:
        return [f"Throughput and mean TTFT of all tools agree within {tol:.0%}."]
    out = [f"Differences above {tol:.0%} and why:"]
    for (tool, name), v in sorted(big.items()):
        key = "pa" if tool == "perf_analyzer" else "genai"
        if name == "ttft_mean":
            why = _noise(fx.samples.get("ours_ttft", []), fx.samples.get(f"{key}_ttft", []))
            out.append(f"* {tool} mean TTFT {v:+.1%}: {why}.")
        else:
            why = _noise(fx.samples.get("ours_e2e", []), fx.samples.get(f"{key}_e2e", []))
            out.append(
                f"* {tool} throughput {v:+.1%}: in a closed loop throughput = concurrency / mean "
                f"end-to-end latency, so it follows the end-to-end times — {why}; the runs are "
                "sequential on a shared host whose load varies."
            )
    return out


def fixed_load_section(fx: FixedLoadResult | None, tol: float) -> list[str]:
    lines = ["## Load generators at the same fixed load", ""]
    if fx is None:
        return lines + ["Not run (--skip-fixed-load).", ""]
    lines.append(
        f"Closed loop, concurrency {fx.concurrency}, the same {fx.requests} real-text prompts of "
        f"{INPUT_TOKENS} tokens with {OUTPUT_TOKENS} output tokens each, in the same order, one "
        "tool after the other on the bucketserve server (loadgen, perf_analyzer, genai-perf). "
        "Commands and raw outputs: `perf_analyzer/`, `genai-perf/`."
    )
    rows, diffs = table(fx)
    lines += ["", *rows]
    rep = fx.pa_reported or {}
    if rep:
        lat = float(rep.get("Avg latency", "nan")) / 1e6
        lines.append(f"| perf_analyzer's own report | | {rep.get('Inferences/Second')} infer/s, "
                     f"avg latency {lat:.3f} s | | | |")  # fmt: skip
    for tool, err in (("perf_analyzer", fx.pa_error), ("genai-perf", fx.genai_error)):
        if err:
            lines += ["", f"{tool} did not complete: `{err}`"]
    return lines + ["", NOTES, "", *explain(fx, diffs, tol), ""]
