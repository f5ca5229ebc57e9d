"""Sweep rates as fractions of a capacity probed once, so a sweep brackets the knee of the
curve on any machine (a shared 2-core CPU and a quiet one differ several-fold)."""

from __future__ import annotations

from dataclasses import dataclass

from bucketserve.bench import aio
from bucketserve.bench.loadgen import LoadConfig, run_closed_loop
from bucketserve.bench.metrics import summarize
from bucketserve.bench.workloads import BenchRequest

PROBE_CONCURRENCY = 4
PROBE_REQUESTS = 12
PROBE_TIMEOUT_S = 60.0


def probe_capacity(url: str, reqs: list[BenchRequest]) -> float:
    """Finished requests/s of a short closed loop (concurrency 4) over the workload's first
    requests: roughly the rate at which the server saturates."""
    cfg = LoadConfig(url=url, duration_s=PROBE_TIMEOUT_S, max_requests=PROBE_REQUESTS,
                     drain_s=PROBE_TIMEOUT_S)  # fmt: skip
    records = aio.run(run_closed_loop(reqs[:PROBE_REQUESTS], PROBE_CONCURRENCY, cfg))
    served = summarize("probe", 0.0, records).served_rate
    if served <= 0:
        raise RuntimeError("capacity probe finished no request")
    return served


@dataclass(slots=True)
class AutoRates:
    """Rates = fractions x capacity; the capacity is probed on the first server asked."""

    fractions: tuple[float, ...]
    reqs: list[BenchRequest]
    capacity: float | None = None
    probed_on: str = ""

    def __call__(self, url: str, label: str) -> tuple[float, ...]:
        if self.capacity is None:
            self.capacity = probe_capacity(url, self.reqs)
            self.probed_on = label
            print(f"[{label}] probed capacity {self.capacity:.3f} req/s", flush=True)
        return tuple(float(f"{f * self.capacity:.2g}") for f in self.fractions)

    def describe(self) -> str:
        if self.capacity is None:
            return "fractions of a probed capacity (probe did not run)"
        fr = ", ".join(f"{f:g}" for f in self.fractions)
        return (f"{fr} x the capacity probed on `{self.probed_on}` ({self.capacity:.3f} req/s: "
                f"closed loop, concurrency {PROBE_CONCURRENCY}, {PROBE_REQUESTS} requests)")  # fmt: skip
