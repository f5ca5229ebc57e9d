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
        r = self.registry
        self.restarts = Counter(
            "bucketserve_server_restarts",
            "tritonserver restarts by the supervisor, by the part that failed",
            ["part"],  # tritonserver, or the model of the stub that died (decode, prefill, ...)
            registry=r,
        )
        self.ready = Gauge(
            "bucketserve_server_ready", "1 while the server takes requests", registry=r
        )
        self.rejected = Counter(
            "bucketserve_front_rejected_requests",
            "Requests the front answered itself without reaching Triton, by reason",
            ["reason"],
            registry=r,
        )
        self.broken = Counter(
            "bucketserve_front_broken_requests",
            "In-flight requests ended with an error because the server went away",
            registry=r,
        )
        self.canary_latency = Histogram(
            "bucketserve_canary_latency_seconds",
            "Time of the supervisor's canary request through every stage",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60),
            registry=r,
        )
        self.canary_failures = Counter(
            "bucketserve_canary_failures",
            "Canary requests that got no FINAL in time (or an error other than busy)",
            registry=r,
        )
        self.inflight = Gauge(
            "bucketserve_front_inflight_requests", "Requests being relayed now", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
