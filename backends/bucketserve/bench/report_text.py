"""The setup section of the report: build, workload, SLOs, arrival process, client."""

from __future__ import annotations

from bucketserve.bench.sweep import SweepResult


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
        f"* **Rates** (req/s): {ctx['rates']}; each rate sends for "
        f"{ctx['duration_s']:g} s (at most {ctx['max_requests']} requests), then waits up to "
        f"{ctx['drain_s']:g} s for running requests (still running after that: counted as failed).",
        f"* **Warm-up**: {ctx['warmup']} requests per server start, untimed.",
        "* **Client**: bucketserve.bench.loadgen, asyncio gRPC streaming (one stream per request), the "
        "ensemble model `bucketserve`; TTFT = send to first token, TPOT = (last token - first "
        "token) / (tokens - 1), ITL = gaps between token-bearing responses spread over their tokens.",
        f"* **Server start times**: {starts}. Total wall time {ctx['wall_s']:.0f} s.",
        f"* **Host**: {ctx['host_note']}",
        "",
    ]
