"""Report section: our load generator vs perf_analyzer, genai-perf and AIPerf at the same fixed load."""

from __future__ import annotations

import math

import numpy as np

from bucketserve.bench.fixed_load import EXTERNAL, INPUT_TOKENS, OUTPUT_TOKENS, FixedLoadResult
from bucketserve.bench.genai_perf import metric

TOOLS = ("loadgen again", "perf_analyzer", *EXTERNAL)
ROWS = (  # (RunSummary field, label, genai-perf / AIPerf metric name, statistic)
    ("served_rate", "throughput (req/s)", "Request Throughput", "value"),
    ("output_tok_s", "output tokens/s", "Output Token Throughput", "value"),
    ("ttft_mean", "TTFT mean (s)", "Time To First Token", "avg"),
    ("ttft_p50", "TTFT p50 (s)", "Time To First Token", "p50"),
    ("tpot_mean", "TPOT / ITL mean (s)", "Inter Token Latency", "avg"),
    ("e2e_p50", "end-to-end p50 (s)", "Request Latency", "p50"),
)
NOTES = (
    "perf_analyzer's own `Avg latency` for a decoupled model is the time to the *last* response "
    "of each request (checked against its profile export) although its log says it uses the "
    "first response; its `Inferences/Second` counts requests completed in its measurement "
    "window. Its column is computed from its per-response timestamps with our code. genai-perf's "
    "and AIPerf's columns are their own CSVs; they count output tokens by re-tokenising the "
    "streamed text, so their token throughput can read a little lower; AIPerf goes through the "
    "OpenAI front (its own process and an SSE hop), the others straight to Triton's gRPC. Client CPU time is getrusage of our process, or "
    "of the tool's subprocesses (genai-perf's includes its Python start-up and tokenizer)."
)


def _cell(v: float | None, ref: float | None) -> tuple[str, str]:
    if v is None:
        return "-", "-"
    diff = f"{(v - ref) / ref:+.1%}" if ref else "-"
    return f"{v:.4g}", diff


def _tool_values(fx: FixedLoadResult, name, ext_metric, stat) -> dict[str, float | None]:
    return {
        "loadgen again": getattr(fx.ours_again, name) if fx.ours_again else None,
        "perf_analyzer": getattr(fx.pa, name) if fx.pa else None,
        **{t: metric(fx.ext[t], ext_metric, stat) if t in fx.ext else None for t in EXTERNAL},
    }


def table(fx: FixedLoadResult) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Markdown rows and the relative differences {(tool, field): diff} vs the first loadgen."""
    head = "| metric | loadgen | " + " | ".join(f"{t} | diff" for t in TOOLS) + " |"
    lines = [head, "|---" * (2 + 2 * len(TOOLS)) + "|"]
    diffs = {}
    for name, label, ext_metric, stat in ROWS:
        ours = getattr(fx.ours, name)
        values = _tool_values(fx, name, ext_metric, stat)
        cells = []
        for tool in TOOLS:
            if values[tool] is not None and ours:
                diffs[(tool, name)] = (values[tool] - ours) / ours
            cells += _cell(values[tool], ours)
        lines.append(
            f"| {label} | {'-' if ours is None else f'{ours:.4g}'} | {' | '.join(cells)} |"
        )
    for label, values in (("client CPU time (s)", fx.cpu_s), ("host load avg at start", fx.load)):
        cells = [f"{values[t]:.2f}" if t in values else "-" for t in ("loadgen", *TOOLS)]
        lines.append(
            f"| {label} | " + " | ".join([cells[0], *(f"{c} | " for c in cells[1:])]) + "|"
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


SAMPLE_KEYS = {"loadgen again": "again", "perf_analyzer": "pa", **{t: t for t in EXTERNAL}}


def explain(fx: FixedLoadResult, diffs: dict, tol: float) -> list[str]:
    big = {k: v for k, v in diffs.items() if k[1] in ("served_rate", "ttft_mean") and abs(v) > tol}
    if not big:
        return [f"Throughput and mean TTFT of all runs agree within {tol:.0%}."]
    out = [f"Differences above {tol:.0%} and why:"]
    for (tool, name), v in sorted(big.items()):
        key = SAMPLE_KEYS[tool]
        if name == "ttft_mean":
            why = _noise(fx.samples.get("ours_ttft", []), fx.samples.get(f"{key}_ttft", []))
            out.append(f"* {tool} mean TTFT {v:+.1%}: {why}.")
        else:
            why = _noise(fx.samples.get("ours_e2e", []), fx.samples.get(f"{key}_e2e", []))
            out.append(
                f"* {tool} throughput {v:+.1%}: in a closed loop throughput = concurrency / mean "
                f"end-to-end latency, so it follows the end-to-end times — {why}."
            )
    again = {k[1]: v for k, v in diffs.items() if k[0] == "loadgen again"}
    if again:
        out.append(
            f"* Our own load generator, rerun last on the same server, moved by "
            f"{again.get('served_rate', 0):+.1%} in throughput and {again.get('ttft_mean', 0):+.1%} "
            "in mean TTFT: that is the drift of this shared host over the minutes between runs; "
            "a tool-to-tool difference of that size is not a disagreement between the tools."
        )
        out += _versus_again(fx)
    return out


def _versus_again(fx: FixedLoadResult) -> list[str]:
    """The other tools against the *second* loadgen run (the one closest to them in time)."""
    lines = []
    for tool, summary in (("perf_analyzer", fx.pa),):
        if summary is None or fx.ours_again is None:
            continue
        thr = (summary.served_rate - fx.ours_again.served_rate) / fx.ours_again.served_rate
        ttft = (summary.ttft_mean - fx.ours_again.ttft_mean) / fx.ours_again.ttft_mean
        lines.append(
            f"* {tool} vs the second loadgen run: throughput {thr:+.1%}, mean TTFT {ttft:+.1%}."
        )
    for tool, table in fx.ext.items():
        rate = metric(table, "Request Throughput", "value")
        ttft = metric(table, "Time To First Token", "avg")
        if fx.ours_again is not None and rate and ttft:
            lines.append(
                f"* {tool} vs the second loadgen run: throughput "
                f"{(rate - fx.ours_again.served_rate) / fx.ours_again.served_rate:+.1%}, mean TTFT "
                f"{(ttft - fx.ours_again.ttft_mean) / fx.ours_again.ttft_mean:+.1%}."
            )
    return lines


def fixed_load_section(fx: FixedLoadResult | None, tol: float) -> list[str]:
    lines = ["## Load generators at the same fixed load", ""]
    if fx is None:
        return lines + ["Not run (--skip-fixed-load).", ""]
    lines.append(
        f"Closed loop, concurrency {fx.concurrency}, the same {fx.requests} real-text prompts of "
        f"{INPUT_TOKENS} tokens with {OUTPUT_TOKENS} output tokens each, in the same order, one "
        "tool after the other on the bucketserve server (loadgen, perf_analyzer, then "
        + ", ".join(f"{t} ({how})" for t, (_, how) in EXTERNAL.items())
        + ", loadgen again). Commands and raw outputs: `perf_analyzer/`, "
        + ", ".join(f"`{folder}/`" for folder, _ in EXTERNAL.values())
        + "."
    )
    rows, diffs = table(fx)
    lines += ["", *rows]
    rep = fx.pa_reported or {}
    if rep:
        lat = float(rep.get("Avg latency", "nan")) / 1e6
        own = f"{rep.get('Inferences/Second')} infer/s, avg latency {lat:.3f} s"
        cells = ["perf_analyzer's own report", "", "", "", own] + [""] * (2 * len(TOOLS) - 3)
        lines.append("| " + " | ".join(cells) + " |")
    for tool, err in (("perf_analyzer", fx.pa_error), *fx.ext_errors.items()):
        if err:
            lines += ["", f"{tool} did not complete: `{err}`"]
    return lines + ["", NOTES, "", *explain(fx, diffs, tol), ""]
