"""Benchmark metrics from per-request records: SLO attainment, goodput, throughput, capacity.

Definitions (DistServe's, research/papers.md §4.1): a request attains its SLO when TTFT and
TPOT are both within their SLOs; requests that fail or do not finish count as misses.
Goodput at X % = the highest rate whose attainment is >= X %, linearly interpolated towards
the next (failing) rate of the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bucketserve.bench.records import RequestRecord

GOODPUT_TARGETS = (0.8, 0.9, 0.99)


def attainment(records: Sequence[RequestRecord], scale: float = 1.0) -> float | None:
    """Share of all sent requests meeting both SLOs (scaled by `scale`); None if none was sent."""
    if not records:
        return None
    return sum(r.meets_slo(scale) for r in records) / len(records)


@dataclass(frozen=True, slots=True)
class Goodput:
    """Goodput at one attainment target; `kind` says how the rate was found.

    "interpolated": between two measured rates; "at-least": every measured rate attained it
    (the true goodput is >= rate); "below-range": even the lowest rate missed it (rate = 0).
    """

    target: float
    rate: float
    kind: str

    def label(self) -> str:
        if self.kind == "at-least":
            return f">= {self.rate:.3g}"
        if self.kind == "below-range":
            return "< lowest rate"
        return f"{self.rate:.3g}"


def goodput(rates: Sequence[float], attainments: Sequence[float], target: float) -> Goodput:
    """Highest rate with attainment >= target, interpolated towards the next rate."""
    if len(rates) != len(attainments) or not rates:
        raise ValueError("need one attainment per rate and at least one rate")
    pts = sorted(zip(rates, attainments, strict=True))
    ok = [i for i, (_, a) in enumerate(pts) if a >= target]
    if not ok:
        return Goodput(target, 0.0, "below-range")
    i = ok[-1]
    if i == len(pts) - 1:
        return Goodput(target, pts[i][0], "at-least")
    (r0, a0), (r1, a1) = pts[i], pts[i + 1]
    return Goodput(target, r0 + (a0 - target) * (r1 - r0) / (a0 - a1), "interpolated")


def percentile(values: Sequence[float], q: float) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.percentile(vals, q)) if vals else None


def mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical cumulative probabilities (i / n)."""
    x = np.sort(np.asarray([v for v in values if v is not None], dtype=np.float64))
    return x, np.arange(1, len(x) + 1) / max(1, len(x))


@dataclass(slots=True)
class RunSummary:
    """One (policy, rate) point. Rates in requests/s, times in seconds."""

    label: str
    offered_rate: float
    sent: int
    ok: int
    failed: int
    send_window_s: float
    makespan_s: float
    sent_rate: float | None  # requests actually sent per second of the send window
    served_rate: float
    output_tok_s: float
    attainment: float | None  # None: no request was sent at this rate
    ttft_attainment: float
    tpot_attainment: float
    ttft_mean: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_mean: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    itl_p50: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    sched_ms_per_request: float | None = None
    sched_share: float | None = None
    mean_prefill_batch: float | None = None
    prefill_batches: float | None = None  # server-side, between the run's two scrapes
    prefill_busy_s: float | None = None  # sum of prefill batch latencies the scheduler saw
    load_avg: float | None = None  # 1-min load average of the host during the run
    idle_wait_s: float | None = None  # server drain after the run (None: not idle in time)
    role_changes: float | None = None  # hybrid: layout changes of the role controller
    migrations: float | None = None  # hybrid: decodes moved between instances


def summarize(
    label: str, rate: float, records: Sequence[RequestRecord], window_s: float | None = None
) -> RunSummary:
    """Aggregate one run. Throughput = finished requests (and their tokens) per makespan.

    Open loop (`window_s` = the send window): makespan runs from the start of the run to the
    later of the window's end and the last finish, so a lightly loaded run is not credited
    with more than it was offered. Closed loop (None): from the first send to the last finish.
    """
    done = [r for r in records if r.ok]
    t0 = 0.0 if window_s else min((r.t_send_s for r in records), default=0.0)
    t_end = max([window_s or 0.0, *(r.t_done_s for r in done)], default=t0)
    makespan = max(t_end - t0, 1e-9)
    sends = [r.t_send_s for r in records]
    window = window_s or (max(sends) - min(sends) if sends else 0.0)
    ttft, tpot, e2e = ([getattr(r, k) for r in done] for k in ("ttft_s", "tpot_s", "e2e_s"))
    itl = [x for r in done for x in r.itl_s]
    n = max(1, len(records))
    return RunSummary(
        label=label, offered_rate=rate, sent=len(records), ok=len(done),
        failed=len(records) - len(done), send_window_s=window, makespan_s=makespan,
        sent_rate=len(records) / window if window > 0 else None,
        served_rate=len(done) / makespan,
        output_tok_s=sum(r.output_tokens for r in done) / makespan,
        attainment=attainment(records),
        ttft_attainment=sum(r.ok and r.ttft_s <= r.ttft_slo_s for r in records) / n,
        tpot_attainment=sum(r.ok and (r.tpot_s is None or r.tpot_s <= r.tpot_slo_s) for r in records) / n,
        ttft_mean=mean(ttft), ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99), tpot_mean=mean(tpot), tpot_p50=percentile(tpot, 50),
        tpot_p90=percentile(tpot, 90), itl_p50=percentile(itl, 50), itl_p99=percentile(itl, 99),
        e2e_p50=percentile(e2e, 50), e2e_p99=percentile(e2e, 99),
    )  # fmt: skip
