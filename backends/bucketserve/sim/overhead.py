"""Scheduler cost: wall time per decision, by bucket count, and as a share of execution time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bucketserve.sim.outcome import SimOutcome


@dataclass(slots=True)
class Overhead:
    policy: str
    rate: float
    decisions: int
    mean_us: float
    p99_us: float
    mean_us_by_buckets: dict[str, float]
    decisions_by_buckets: dict[str, int]
    share_of_gpu_time: float
    share_of_makespan: float
    max_buckets: int


def measure(out: SimOutcome, rate: float) -> Overhead:
    """Summarise out.decision_s (wall seconds of every next_batch call) against the run."""
    us = np.asarray(out.decision_s) * 1e6
    nb = np.asarray(out.decision_buckets)
    by_mean, by_count = {}, {}
    for key, sel in [(str(k), nb == k) for k in sorted(set(nb[nb <= 8].tolist()))] + [
        (">8", nb > 8)
    ]:
        by_count[key] = int(sel.sum())
        by_mean[key] = float(us[sel].mean()) if sel.any() else float("nan")
    busy = out.prefill_busy_s + out.decode_busy_s
    start = min(r.meta.arrival_s for r in out.requests)
    end = max(r.finish_s for r in out.requests)
    total = float(us.sum()) / 1e6
    return Overhead(
        out.policy, rate, int(us.size), float(us.mean()), float(np.percentile(us, 99)), by_mean, by_count,
        total / busy if busy else 0.0, total / (end - start), out.max_buckets,
    )  # fmt: skip
