"""Servers the perf scripts start on this machine: free loopback ports, a fresh run folder."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable

from bucketserve.serving.ports import free_port


def local_server(run_prefix: str, **overrides):
    """A TritonServer (not started yet) on free ports; `overrides` are ServeConfig fields
    (the separate OpenAI port is off unless given: the edge serves those routes too)."""
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launcher import TritonServer

    fields = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port(),
              "openai_port": 0, "run_dir": tempfile.mkdtemp(prefix=run_prefix)}  # fmt: skip
    return TritonServer(ServeConfig(**(fields | overrides)))


def caching_on_then_off(run_prefix: str, run: Callable[[str, str], list[dict]], **overrides):
    """run(http_url, label) on a started server with prefix caching on, then on one with it
    off; prints the summaries run returns, one JSON line each, after each server stopped."""
    for caching in (True, False):
        label = f"prefix caching {'on' if caching else 'off'}"
        server = local_server(run_prefix, enable_prefix_caching=caching, **overrides)
        server.start_ready()
        try:
            summaries = run(server.http_url, label)
        finally:
            server.stop()
        for summary in summaries:
            print(json.dumps(summary), flush=True)
