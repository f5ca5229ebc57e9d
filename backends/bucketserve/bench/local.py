"""Servers the perf scripts start on this machine (free loopback ports, a fresh run folder),
and one greedy streamed request to them, timed."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable

import requests

from bucketserve.serving.launch.ports import free_port


def local_server(run_prefix: str, **overrides):
    """A TritonServer (not started yet) on free ports; `overrides` are ServeConfig fields
    (the separate OpenAI port is off unless given: the edge serves those routes too)."""
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launch.launcher import TritonServer

    fields = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port(),
              "openai_port": 0, "run_dir": tempfile.mkdtemp(prefix=run_prefix)}  # fmt: skip
    return TritonServer(ServeConfig(**(fields | overrides)))


def caching_on_then_off(run_prefix: str, run: Callable[[object, str], list[dict]], **overrides):
    """run(server, label) on a started server behind the HTTP edge (v2 and OpenAI routes, as
    users reach it: `server.http_url`, `server.openai_url`) with prefix caching on, then on one
    with it off; prints the summaries run returns, one JSON line each, after each stopped."""
    from bucketserve.serving.front.local import LocalEdge

    for caching in (True, False):
        label = f"prefix caching {'on' if caching else 'off'}"
        raw = local_server(run_prefix, enable_prefix_caching=caching, **overrides)
        raw.start_ready()
        try:
            server = LocalEdge(raw)
        except BaseException:
            raw.stop()
            raise
        try:
            summaries = run(server, label)
        finally:
            server.stop()
        for summary in summaries:
            print(json.dumps(summary), flush=True)


def stream_greedy(url: str, model: str, text: str, max_tokens: int, salt: str) -> dict:
    """One greedy `generate_stream` request under `cache_salt` salt: TTFT (first event), TPOT,
    the reply text, the server's token counts and finish reason."""
    body = {"text_input": text, "max_tokens": max_tokens, "temperature": 0.0,
            "cache_salt": salt, "stream": True}  # fmt: skip
    start, ttft, parts, last = time.monotonic(), None, [], {}
    with requests.post(f"http://{url}/v2/models/{model}/generate_stream", json=body,
                       timeout=600, stream=True) as r:  # fmt: skip
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                ttft = ttft if ttft is not None else time.monotonic() - start
                last = json.loads(line[len(b"data: ") :])
                parts.append(last.get("text_output", ""))
    total = time.monotonic() - start
    out_tokens = last.get("num_output_tokens") or 0
    tpot = (total - ttft) / (out_tokens - 1) if out_tokens > 1 else 0.0
    return {"ttft_s": round(ttft, 4), "tpot_s": round(tpot, 4), "reply": "".join(parts),
            "num_input_tokens": last.get("num_input_tokens"),
            "num_cached_tokens": last.get("num_cached_tokens") or 0,
            "finish_reason": last.get("finish_reason")}  # fmt: skip
