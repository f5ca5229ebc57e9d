"""The HTTP front's own cost per streamed event, without a model (so CPU noise from the model
does not drown it): an upstream process emits SSE events stamped with their send time every
`--interval-ms`; a client reads them direct and through a Front, interleaved, and reports the
delivery delay (arrival - send) per event for each path.

  perf/front_overhead.py --events 400 --streams 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import httpx
from bucketserve.serving.serve_process import free_port

UPSTREAM = """
import asyncio, sys, time, uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
n, interval = int(sys.argv[2]), float(sys.argv[3])
async def events():
    for i in range(n):  # the last one carries a finish reason, as Triton's does
        reason = "length" if i == n - 1 else ""
        yield f'data: {{"t": {time.time()!r}, "finish_reason": "{reason}"}}\\n\\n'.encode()
        await asyncio.sleep(interval)
async def stream(request):
    await request.body()
    return StreamingResponse(events(), media_type="text/event-stream")
app = Starlette(routes=[Route("/v2/models/m/generate_stream", stream, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


FRONT = """
import sys, time
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
health = Health()
health.set(READY, upstream=sys.argv[2])
FrontServer(Front(health, FrontMetrics(), 1 << 22), "127.0.0.1", int(sys.argv[1])).start()
time.sleep(3600)
"""


async def read(client: httpx.AsyncClient, url: str) -> list[float]:
    delays = []
    async with client.stream("POST", url, json={"text_input": "x"}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                delays.append(time.time() - json.loads(line[6:])["t"])
    return delays


async def round_of(base: str, streams: int) -> list[float]:
    async with httpx.AsyncClient(timeout=60) as client:
        url = f"{base}/v2/models/m/generate_stream"
        results = await asyncio.gather(*(read(client, url) for _ in range(streams)))
    return [d for r in results for d in r]


def ms(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=400)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    up_port, front_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port), str(a.events),
                           str(a.interval_ms / 1000)])  # fmt: skip
    upstream = f"http://127.0.0.1:{up_port}"
    # the front in its own process, as in `bucketserve serve` (not sharing the client's GIL)
    front = subprocess.Popen([sys.executable, "-c", FRONT, str(front_port), upstream])
    try:
        time.sleep(3.0)
        paths = {"direct": upstream, "front": f"http://127.0.0.1:{front_port}"}
        asyncio.run(round_of(paths["front"], 2))  # warm-up, untimed
        res: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(a.rounds):
            for name, base in paths.items():
                res[name] += asyncio.run(round_of(base, a.streams))
    finally:
        front.kill()
        up.kill()
    for name, d in res.items():
        print(f"{name:6s} delivery delay p50 {ms(d, 50):6.3f} ms  p90 {ms(d, 90):6.3f} ms"
              f"  p99 {ms(d, 99):6.3f} ms  (events={len(d)})")  # fmt: skip
    print(f"front adds p50 {ms(res['front'], 50) - ms(res['direct'], 50):+.3f} ms,"
          f" p90 {ms(res['front'], 90) - ms(res['direct'], 90):+.3f} ms per event")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
