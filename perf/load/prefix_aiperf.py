"""AIPerf's shared-system-prompt workload through the OpenAI front, prefix caching on vs off.

Every request is a chat with one system prompt of --system-tokens tokens, identical across all
requests (AIPerf's --shared-system-prompt-length), and a synthetic user message of its own;
streamed, --output-tokens each, --concurrency at a time. For each seed a fresh AIPerf run on a
server with prefix caching on, then the same seeds on one with it off (one server each,
started here; SmolLM2, the default topology). Prints one JSON line per (server, seed) with
AIPerf's TTFT avg / p50 / p90, TPOT and request throughput, and the server's own count of
prompt tokens found cached (Prometheus) over that run.

    .venv/bin/python perf/load/prefix_aiperf.py [--seeds 0 1 2] [--system-tokens 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bucketserve.bench import aiperf_run
from bucketserve.bench.genai_perf import metric, read_csv, run_script
from bucketserve.bench.local import caching_on_then_off
from bucketserve.bench.prom import scrape, total

HITS, QUERIES = "bucketserve_prefix_cache_hits_total", "bucketserve_prefix_cache_queries_total"


def run_seed(openai_url: str, metrics_url: str, args, seed: int, label: str) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"aiperf-prefix-{seed}-"))
    env = dict(os.environ, CONCURRENCY=str(args.concurrency), REQUESTS=str(args.requests),
               OUTPUT_MEAN=str(args.output_tokens), INPUT_MEAN=str(args.user_tokens),
               SEED=str(seed), ENDPOINT="chat",
               EXTRA_ARGS=f"--shared-system-prompt-length {args.system_tokens}")  # fmt: skip
    before = scrape(metrics_url)
    proc = run_script(aiperf_run.SCRIPT, openai_url, out, env, 1800)
    table = read_csv(aiperf_run.aiperf_csv(proc, out, args.concurrency))
    after = scrape(metrics_url)
    hits, queries = (total(after, n) - total(before, n) for n in (HITS, QUERIES))

    def stat(name: str, s: str) -> float | None:
        v = metric(table, name, s)
        return None if v is None else round(v, 4)

    return {
        "server": label, "seed": seed, "requests": stat("Request Count", "value"),
        "ttft_avg_s": stat("Time to First Token", "avg"),
        "ttft_p50_s": stat("Time to First Token", "p50"),
        "ttft_p90_s": stat("Time to First Token", "p90"),
        "tpot_avg_s": stat("Inter Token Latency", "avg"),
        "request_throughput": stat("Request Throughput", "value"),
        "cached_share": round(hits / queries, 3) if queries else 0.0, "artifacts": str(out),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--user-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--topology", default="auto")
    args = p.parse_args(argv)

    def run(server, label):
        return [run_seed(server.openai_url, server.metrics_url, args, seed, label)
                for seed in args.seeds]  # fmt: skip

    caching_on_then_off("aiperf-prefix-", run, topology=args.topology)
    return 0


if __name__ == "__main__":
    sys.exit(main())
