"""One load run against a server that is already up: open loop at a rate, or closed loop.

    python perf/load/run_load.py --url 127.0.0.1:8001 --workload alpaca --rate 1 --duration 30 \\
        --out perf/results/tmp/alpaca_r1.jsonl
    python perf/load/run_load.py --concurrency 4 --requests 32 --arrival gamma --cv 3 ...

Writes one JSON line per request (bucketserve.bench.records) and prints the run's summary numbers.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from pathlib import Path

from bucketserve.bench.arrivals import Arrivals, load_trace
from bucketserve.bench.loadgen import LoadConfig, run_closed_loop, run_open_loop, warm_up
from bucketserve.bench.metrics import summarize
from bucketserve.bench.records import write_jsonl
from bucketserve.bench.textsource import TextSource, load_tokenizer
from bucketserve.bench.workloads import (
    PROFILES,
    WORKLOADS,
    build_requests,
    requests_from_lengths,
    workload,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC host:port")
    p.add_argument("--model", default="bucketserve", help="bucketserve or bucketserve_bls")
    p.add_argument("--workload", default="alpaca", choices=WORKLOADS)
    p.add_argument("--profile", default="cpu", choices=PROFILES)
    p.add_argument("--input-cap", type=int)
    p.add_argument("--rate", type=float, help="open loop: requests/s")
    p.add_argument("--concurrency", type=int, help="closed loop: requests in flight")
    p.add_argument("--arrival", default="poisson", choices=("poisson", "gamma", "trace"))
    p.add_argument("--cv", type=float, default=2.0)
    p.add_argument("--trace")
    p.add_argument("--duration", type=float, default=60.0, help="send window (s)")
    p.add_argument("--drain", type=float, default=120.0)
    p.add_argument("--requests", type=int, default=1000, help="at most this many")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("perf/results/tmp/run_load.jsonl"))
    a = p.parse_args()
    if (a.rate is None) == (a.concurrency is None):
        p.error("give exactly one of --rate (open loop) or --concurrency (closed loop)")
    return a


def make_requests(a: argparse.Namespace, text: TextSource):
    """The workload's requests, or the trace's lengths under the workload's first SLO."""
    wl = workload(a.workload, a.profile, a.input_cap)
    if a.arrival != "trace":
        return build_requests(wl, a.requests + a.warmup, a.seed, text), None
    trace = load_trace(a.trace)
    lengths = list(zip(trace.input_lengths.tolist(), trace.output_lengths.tolist(), strict=True))
    return requests_from_lengths(lengths, a.seed, text, wl.sources[0]), trace


def main() -> None:
    a = parse_args()
    reqs, trace = make_requests(a, TextSource.build(load_tokenizer()))
    cfg = LoadConfig(a.url, a.model, a.duration, a.requests, a.drain, seed=a.seed)
    if a.warmup:
        warm_up(reqs[-a.warmup :], cfg, n=a.warmup)
    if a.concurrency is not None:
        records = asyncio.run(run_closed_loop(reqs, a.concurrency, cfg))
        summary = summarize(f"c{a.concurrency}", 0.0, records)
    else:
        arr = Arrivals(a.arrival, a.cv, trace)
        times = arr.send_times(len(reqs), a.rate, a.seed)
        records = asyncio.run(run_open_loop(reqs, times, a.rate, cfg))
        summary = summarize(f"rate{a.rate:g}", a.rate, records, window_s=a.duration)
    write_jsonl(records, a.out)
    for key, value in asdict(summary).items():
        print(f"{key:>18}: {value}")
    print(f"requests: {a.out}")


if __name__ == "__main__":
    main()
