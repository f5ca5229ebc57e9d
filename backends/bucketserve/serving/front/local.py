"""A TritonServer behind the edges in this process, as `bucketserve serve` users reach it (the
server tests and benchmarks start Triton themselves, without the supervisor): HTTP and gRPC
clients use `http_url` / `grpc_url`, the edges' free ports, never Triton's own."""

from __future__ import annotations

from bucketserve.serving.front.allowlist import grpc_metadata
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launch.launcher import TritonServer, triton_metrics_url
from bucketserve.serving.launch.ports import Port, free_port
from bucketserve.serving.launch.service import (
    access_policy,
    grpc_edge,
    openai_settings,
)


class LocalEdge:
    """`server` (started and ready) behind an HTTP edge on a free port, plus cfg.openai_port
    when set, and a gRPC edge on another free port; every other attribute is the server's."""

    def __init__(self, server: TritonServer, max_concurrent: int = 0) -> None:
        self.server = server
        cfg = server.cfg
        health = Health()
        health.set(READY, upstream=f"http://{server.http_url}")
        metrics = FrontMetrics()
        self.front = Front(health, metrics, cfg.max_request_bytes, server.grpc_url,
                           max_concurrent, openai_settings(cfg), triton_metrics_url(cfg),
                           access_policy(cfg), grpc_metadata(cfg.api_key))  # fmt: skip
        self.port = free_port()
        more = (Port(cfg.openai_port, "--openai-port"),) if cfg.openai_port else ()
        self.web = FrontServer(self.front, "127.0.0.1", self.port, more)
        self.rpc = grpc_edge(cfg, server.grpc_url, metrics, "127.0.0.1", 0)
        self.web.start()

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        """The gRPC edge (entry models only), as `--grpc-port` of `bucketserve serve`."""
        return f"127.0.0.1:{self.rpc.port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI base URL (without /v1): the OpenAI port if set, else the edge's."""
        port = self.server.cfg.openai_port or self.port
        return f"http://127.0.0.1:{port}"

    def __getattr__(self, name: str):
        return getattr(self.server, name)

    def stop(self) -> None:
        self.rpc.stop(grace_s=1.0)
        self.web.stop()
        self.server.stop()
