"""Locust: streaming HTTP `generate_stream` (SSE) with TTFT and inter-token latency as events.

Each user is a closed loop (no wait) sending the seeded workload's requests in turn. Besides
the `generate_stream` POST itself (its time is to the response headers), every request fires
custom events of type SSE, so they appear in the stats CSV:
  ttft  time to the first token          itl   each gap between tokens (ms per token)
  tpot  (last - first token) / (n - 1)   e2e   time to the end of the stream

    locust -f perf/tools/locustfile.py --headless -u 4 -r 2 -t 60s \\
        --host http://127.0.0.1:8000 --csv perf/results/<dir>/locust

Environment: BENCH_WORKLOAD (alpaca), BENCH_PROFILE (cpu), BENCH_SEED (0), BENCH_REQUESTS
(200), BENCH_MODEL (bucketserve; or bucketserve_bls).
"""

from __future__ import annotations

import itertools
import json
import os
import time

from bucketserve.bench.textsource import TextSource, load_tokenizer
from bucketserve.bench.workloads import build_requests, workload
from locust import HttpUser, constant, events, task

MODEL = os.environ.get("BENCH_MODEL", "bucketserve")
_REQUESTS: list = []
_NEXT = itertools.count()


@events.init.add_listener
def _build_requests(environment, **_kwargs) -> None:
    """Build the seeded request list once per Locust process (tokenizer + stdlib corpus)."""
    wl = workload(
        os.environ.get("BENCH_WORKLOAD", "alpaca"), os.environ.get("BENCH_PROFILE", "cpu")
    )
    n = int(os.environ.get("BENCH_REQUESTS", "200"))
    seed = int(os.environ.get("BENCH_SEED", "0"))
    _REQUESTS.extend(build_requests(wl, n, seed, TextSource.build(load_tokenizer())))


def _tokens(obj: dict) -> int | None:
    v = obj.get("num_output_tokens")
    if isinstance(v, list):
        v = v[0] if v else None
    return None if v is None else int(v)


class GenerateStreamUser(HttpUser):
    """One streaming request after another."""

    wait_time = constant(0)

    def fire(self, name: str, seconds: float, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type="SSE", name=name, response_time=seconds * 1000.0,
            response_length=0, exception=exception, context={},
        )  # fmt: skip

    def body(self) -> dict:
        req = _REQUESTS[next(_NEXT) % len(_REQUESTS)]
        return {
            "text_input": req.prompt, "max_tokens": req.output_tokens,
            "min_tokens": req.output_tokens, "stream": True, "temperature": 0.0,
            "exclude_input_in_output": True, "return_num_output_tokens": True,
            "ttft_slo_ms": req.ttft_slo_s * 1000.0, "tpot_slo_ms": req.tpot_slo_s * 1000.0,
        }  # fmt: skip

    @task
    def generate(self) -> None:
        start = time.perf_counter()
        first = last = None
        count = 0
        url = f"/v2/models/{MODEL}/generate_stream"
        with self.client.post(
            url, json=self.body(), stream=True, catch_response=True, name="generate_stream"
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            for line in resp.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                obj = json.loads(line[5:])
                if "error" in obj:
                    resp.failure(obj["error"])
                    self.fire("e2e", time.perf_counter() - start, RuntimeError(obj["error"]))
                    return
                n = _tokens(obj)
                if n is None or n <= count:
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                    self.fire("ttft", now - start)
                else:
                    for _ in range(n - count):  # a coalesced event: spread its gap over its tokens
                        self.fire("itl", (now - last) / (n - count))
                last, count = now, n
            resp.success()
        self.fire("e2e", time.perf_counter() - start)
        if first is not None and count > 1:
            self.fire("tpot", (last - first) / (count - 1))
