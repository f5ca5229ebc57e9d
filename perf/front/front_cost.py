"""What the HTTP front costs a stream: TTFT and inter-token gaps, direct to Triton vs via the front.

Same server, same run, rounds interleaved (direct, front, direct, ...) at a fixed concurrency,
seeded prompts, one untimed warm-up round. Prints medians and p90s per path and their ratio.

  perf/front/front_cost.py --rounds 4 --concurrency 4 --requests 16 --tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bucketserve.bench.soak_client import sse_lines
from bucketserve.serving.launch.serve_process import ServeProcess


async def stream(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[float, list[float]]:
    """(TTFT, gaps between later events) of one generate_stream call."""
    t0, times = time.perf_counter(), []
    async with client.stream("POST", url, json=payload) as resp:
        async for line in sse_lines(resp):
            if line.startswith("data: "):
                times.append(time.perf_counter())
                if "error" in json.loads(line[6:]):
                    raise RuntimeError(line)
    return times[0] - t0, [b - a for a, b in zip(times, times[1:], strict=False)]


async def one_round(base: str, a, rng: random.Random) -> tuple[list[float], list[float]]:
    url = f"{base}/v2/models/bucketserve/generate_stream"
    sem, ttft, gaps, hung = asyncio.Semaphore(a.concurrency), [], [], []
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(i: int) -> None:
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(20))
            p = {
                "text_input": f"{i} {words}",
                "max_tokens": a.tokens,
                "min_tokens": a.tokens,
                "stream": True,
            }  # one event per token batch, not one answer at the end
            async with sem:
                try:
                    t, g = await asyncio.wait_for(stream(client, url, p), a.timeout_s)
                except TimeoutError:
                    hung.append(i)  # counted, not timed: a stream with no end is a bug
                    return
            ttft.append(t)
            gaps.extend(g)

        await asyncio.gather(*(one(i) for i in range(a.requests)))
    if hung:
        print(f"  {len(hung)} stream(s) of {base} did not end within {a.timeout_s}s", flush=True)
    return ttft, gaps


def triton_port(sp: ServeProcess) -> int:
    """Triton's internal HTTP port, from its command line."""
    for p in sp.processes():
        for arg in p.info["cmdline"]:
            if arg.startswith("--http-port="):
                return int(arg.split("=", 1)[1])
    raise RuntimeError("tritonserver not found")


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000 if len(xs) > 1 else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="per stream")
    a = p.parse_args(argv)
    sp = ServeProcess(Path(tempfile.mkdtemp(prefix="front-cost-")) / "run", "--kv-cache-gb", "0.5")
    sp.start()
    try:
        sp.wait_ready()
        paths = {"direct": f"http://127.0.0.1:{triton_port(sp)}", "front": f"http://{sp.http_url}"}
        asyncio.run(one_round(paths["front"], a, random.Random(-1)))  # warm-up, untimed
        res = {k: ([], []) for k in paths}
        for r in range(a.rounds):
            for name, base in paths.items():
                t, g = asyncio.run(one_round(base, a, random.Random(a.seed + r)))
                res[name][0].extend(t)
                res[name][1].extend(g)
                print(f"round {r} {name}: {len(t)} streams", flush=True)
    finally:
        sp.stop()
    for name, (t, g) in res.items():
        print(f"{name:6s} TTFT p50 {pct(t, 50):7.1f} ms p90 {pct(t, 90):7.1f} ms | inter-token"
              f" p50 {pct(g, 50):6.2f} ms p90 {pct(g, 90):6.2f} ms  (n={len(t)}, gaps={len(g)})")  # fmt: skip
    (dt, dg), (ft, fg) = res["direct"], res["front"]
    print(f"front/direct: TTFT p50 x{pct(ft, 50) / pct(dt, 50):.3f},"
          f" inter-token p50 x{pct(fg, 50) / pct(dg, 50):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
