"""Steady state: does a run's backlog grow, and how did the late requests fare?

A finite run at a rate above capacity can still show good attainment if it is short: the
queue has not had time to grow. So a rate counts for goodput only if the detector finds it
steady, which fails a run on any of three signs:
(a) growth: the backlog (arrived - finished) grew over the second half of the arrival window
    by more than `tolerance` x the offered rate (the run served < 1 - tolerance of what
    arrived) and by more than MIN_GROWTH requests;
(b) a standing backlog: at the last arrival more than BACKLOG_S seconds of arrivals are
    still unfinished (no request of our workloads lives that long unqueued; a queue that deep
    has grown at some point, even if its slope flattened near the end);
(c) collapse: the requests arriving in the last third meet their SLO less than half as often
    as the earlier ones.
The attainment used is the worse of the whole run's and that of its last third (a run that
degrades with time is judged by its end). Turn 3's detector had (a) alone, with a 5 %
tolerance: it passed a 600 s run at 6 req/s with a backlog of 286 and 0 % attainment in its
last third (slope 0.295 req/s, just under 0.05 x 6).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bucketserve.sim.workload import SimRequest

SAMPLES = 24  # backlog samples over the second half of the arrival window
TOLERANCE = 0.02  # backlog growth allowed, as a share of the offered rate
MIN_GROWTH = 10  # requests: below this, growth is noise whatever the slope
BACKLOG_S = 20.0  # seconds of arrivals a steady run may still hold unfinished at the end
COLLAPSE = 0.5  # last-third attainment below this share of the earlier attainment: collapse


@dataclass(slots=True, frozen=True)
class SteadyState:
    """What the detector saw in one run."""

    growing: bool  # (a) or (b): the backlog grew
    slope_rps: float  # backlog growth over the second half (requests per second)
    final_backlog: int  # requests arrived and not finished at the last arrival
    late_attainment: float  # attainment of requests arriving in the last third
    collapsed: bool = False  # (c): the last third met its SLO < COLLAPSE x as often

    @property
    def steady(self) -> bool:
        """Neither growing nor collapsed: the run's rate may count for goodput."""
        return not self.growing and not self.collapsed


def backlog_series(arrivals: Sequence[float], finishes: Sequence[float], times) -> np.ndarray:
    """Requests arrived by t and not finished by t, at each t (unfinished: nan finishes)."""
    arr = sorted(arrivals)
    fin = sorted(f for f in finishes if not math.isnan(f))
    return np.array([bisect_right(arr, t) - bisect_right(fin, t) for t in times], dtype=float)


def detect(
    reqs: Sequence[SimRequest], ok: Callable[[SimRequest], bool], tolerance: float = TOLERANCE
) -> SteadyState:
    """Steady-state check of one run; `ok` says whether a request met its SLO."""
    arrivals = [r.meta.arrival_s for r in reqs]
    first, last = min(arrivals), max(arrivals)
    span = last - first
    if span <= 0:
        return SteadyState(False, 0.0, 0, math.nan)
    times = np.linspace(first + span / 2, last, SAMPLES)
    backlog = backlog_series(arrivals, [r.finish_s for r in reqs], times)
    slope = float(np.polyfit(times, backlog, 1)[0])
    rate = len(reqs) / span
    growth = slope * span / 2
    standing = backlog[-1] > max(MIN_GROWTH, BACKLOG_S * rate)
    growing = bool(slope > tolerance * rate and growth > MIN_GROWTH or standing)
    cut = first + 2 * span / 3
    late = [ok(r) for r in reqs if r.meta.arrival_s >= cut]
    early = [ok(r) for r in reqs if r.meta.arrival_s < cut]
    late_att = sum(late) / len(late) if late else math.nan
    early_att = sum(early) / len(early) if early else math.nan
    collapsed = bool(late and early and late_att < COLLAPSE * early_att)
    return SteadyState(growing, slope, int(backlog[-1]), late_att, collapsed)
