"""Memory that streamed tokens leave in `tritonserver` and the relay stub (`bucketserve_bls`).

  perf/reliability/stream_memory.py                         32 streams x 128 tokens, twice, after a warm wave
  perf/reliability/stream_memory.py --streams 64 --tokens 256 --no-stream

Starts `bucketserve serve`, sends a warm wave of short requests, then waves of `--streams`
concurrent `generate_stream` requests (an 8-word prompt, exactly `--tokens` tokens), waits
for each wave to end and prints RSS and private RSS (less shared pages) of both processes
after it. A second wave of the same shape should add nothing: what the first added is the
high-water mark of tokens held while streams are in flight, not a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bucketserve.bench.soak import WORDS
from bucketserve.bench.soak_client import Target, run_one
from bucketserve.bench.soak_report import rss_by_process
from bucketserve.serving.launch.serve_process import ServeProcess

WATCH = ("tritonserver", "bucketserve_bls_0_0")


async def wave(base: str, n: int, tokens: int, stream: bool, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:

        async def one() -> str:
            text = " ".join(rng.choice(WORDS) for _ in range(8))
            body = {"text_input": text, "max_tokens": tokens, "min_tokens": tokens}
            if stream:
                return (await run_one(client, Target(base), body, 600.0, 0.0)).kind
            r = await client.post(f"{base}/v2/models/bucketserve_bls/generate", json=body)
            return "finished" if r.status_code == 200 else f"status {r.status_code}"

        kinds = await asyncio.gather(*[one() for _ in range(n)])
    return {k: kinds.count(k) for k in set(kinds)}


def sample(sp: ServeProcess) -> dict[str, dict[str, float]]:
    rss, private = rss_by_process(sp), rss_by_process(sp, private=True)
    return {k: {"rss_mb": round(rss[k] / 2**20, 1), "private_mb": round(private[k] / 2**20, 1)}
            for k in WATCH if k in rss}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=32, help="concurrent requests per wave")
    p.add_argument("--tokens", type=int, default=128, help="tokens per request")
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--no-stream", action="store_true", help="generate instead of generate_stream")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="stream-memory-")) / "run"
    sp = ServeProcess(run_dir, "--max-queued-requests", str(max(64, 2 * a.streams)))
    sp.start()
    sp.wait_ready()
    base = f"http://{sp.http_url}"
    rows = []
    try:
        shapes = [(a.streams, 8)] + [(a.streams, a.tokens)] * a.waves
        for i, (n, tokens) in enumerate(shapes):
            t0 = time.monotonic()
            kinds = asyncio.run(wave(base, n, tokens, not a.no_stream, seed=i))
            time.sleep(1.0)
            row = {"wave": "warm" if i == 0 else i, "requests": n, "tokens": tokens,
                   "stream": not a.no_stream, "seconds": round(time.monotonic() - t0, 1),
                   "outcomes": kinds, **sample(sp)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        sp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
