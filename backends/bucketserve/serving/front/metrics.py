"""The front's own Prometheus metrics (served at /metrics on the public HTTP port)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # *_created series only add noise to a scrape


class FrontMetrics:
    """Restarts, readiness and rejections: the numbers that outlive a tritonserver restart."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def new(kind, name: str, doc: str, labels=(), **kw):
            return kind(f"bucketserve_{name}", doc, labels, registry=self.registry, **kw)

        # part: tritonserver, or the model of the stub that died (decode, prefill, ...)
        self.restarts = new(
            Counter,
            "server_restarts",
            "tritonserver restarts by the supervisor, by the part that failed",
            ["part"],
        )
        self.ready = new(Gauge, "server_ready", "1 while the server takes requests")
        self.rejected = new(
            Counter,
            "front_rejected_requests",
            "Requests the front answered itself without reaching Triton, by reason",
            ["reason"],
        )
        self.broken = new(
            Counter,
            "front_broken_requests",
            "In-flight requests ended with an error because the server went away",
        )
        self.canary_latency = new(
            Histogram,
            "canary_latency_seconds",
            "Time of the supervisor's canary request through every stage",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60),
        )
        self.canary_failures = new(
            Counter,
            "canary_failures",
            "Canary requests that got no FINAL in time (or an error other than busy)",
        )
        self.inflight = new(Gauge, "front_inflight_requests", "Requests being relayed now")

    def render(self) -> bytes:
        return generate_latest(self.registry)
