"""Arrival processes: Poisson, bursty Gamma (CV > 1), and replay of a CSV trace.

Send times are unit-rate gaps drawn once per seed and divided by the rate, so every rate of
a sweep (and every policy) sees the same sequence of requests with the same burst shape.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("poisson", "gamma", "trace")


@dataclass(frozen=True, slots=True)
class Trace:
    """A replayable trace: send times (s, first at 0) and per-request token lengths."""

    times_s: np.ndarray
    input_lengths: np.ndarray
    output_lengths: np.ndarray

    @property
    def native_rate(self) -> float:
        """Requests per second of the trace as recorded (n - 1 gaps over its span)."""
        span = float(self.times_s[-1] - self.times_s[0]) if len(self.times_s) > 1 else 0.0
        return (len(self.times_s) - 1) / span if span > 0 else float("inf")


def load_trace(path: str | Path) -> Trace:
    """Read `timestamp,input_length,output_length` rows (header optional, seconds, any origin)."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].strip().startswith("#"):
                continue
            try:
                rows.append((float(row[0]), int(row[1]), int(row[2])))
            except ValueError:
                if rows:  # only the first line may be a header
                    raise ValueError(f"{path}: bad row {row!r}") from None
    if not rows:
        raise ValueError(f"{path}: no rows of timestamp,input_length,output_length")
    arr = np.asarray(sorted(rows), dtype=np.float64)
    if (arr[:, 1] < 1).any() or (arr[:, 2] < 1).any():
        raise ValueError(f"{path}: lengths must be >= 1")
    return Trace(arr[:, 0] - arr[0, 0], arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64))


@dataclass(frozen=True, slots=True)
class Arrivals:
    """An arrival process; `cv` is the coefficient of variation of the Gamma gaps."""

    kind: str = "poisson"
    cv: float = 1.0
    trace: Trace | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrival kind must be one of {KINDS}, got {self.kind!r}")
        if self.cv <= 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if self.kind == "trace" and self.trace is None:
            raise ValueError("trace arrivals need a trace (load_trace)")

    def describe(self) -> str:
        if self.kind == "poisson":
            return "Poisson (exponential inter-arrival gaps, CV = 1)"
        if self.kind == "gamma":
            return f"bursty Gamma inter-arrival gaps, CV = {self.cv:g} (shape {1 / self.cv**2:.3g})"
        return f"trace replay ({len(self.trace.times_s)} requests, native {self.trace.native_rate:.3g} req/s, time-scaled to the rate)"

    def unit_gaps(self, n: int, seed: int) -> np.ndarray:
        """n inter-arrival gaps of mean 1 s (first request at its first gap)."""
        rng = np.random.default_rng([seed, 3])
        if self.kind == "poisson":
            return rng.exponential(1.0, size=n)
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2
            return rng.gamma(shape, 1.0 / shape, size=n)
        native = self.trace.native_rate
        t = self.trace.times_s[:n] * (native if np.isfinite(native) else 0.0)
        return np.diff(t, prepend=0.0)

    def send_times(self, n: int, rate: float, seed: int) -> np.ndarray:
        """Send offsets (s from the start of the run) at `rate` requests per second."""
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        return np.cumsum(self.unit_gaps(n, seed)) / rate
