"""Steady state: does a run's backlog grow, and how did the late requests fare?

A finite run at a rate above capacity can still show good attainment if it is short: the
queue has not had time to grow. So a rate counts for goodput only if (a) the backlog
(arrived - finished) did not grow over the second half of the arrival window by more than
`tolerance` x the offered rate (i.e. the run served >= 1 - tolerance of what arrived), and
(b) the attainment used is the worse of the whole run's and that of the requests arriving in
the last third of the window (a run that degrades with time is judged by its end).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bucketserve.sim.workload import SimRequest

SAMPLES = 24  # backlog samples over the second half of the arrival window
TOLERANCE = 0.05  # backlog growth allowed, as a share of the offered rate
MIN_GROWTH = 10  # requests: below this, growth is noise whatever the slope


@dataclass(slots=True, frozen=True)
class SteadyState:
    """What the detector saw in one run."""

    growing: bool
    slope_rps: float  # backlog growth over the second half (requests per second)
    final_backlog: int  # requests arrived and not finished at the last arrival
    late_attainment: float  # attainment of requests arriving in the last third


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
    growing = slope > tolerance * rate and growth > MIN_GROWTH
    late = [ok(r) for r in reqs if r.meta.arrival_s >= first + 2 * span / 3]
    late_att = sum(late) / len(late) if late else math.nan
    return SteadyState(growing, slope, int(backlog[-1]), late_att)
