"""Distribution-aware bucket boundaries (bucketserve+): decayed histogram + 1-D DP cuts.

The cost of a bucket is its expected padding: for every request in it, (bucket's top length
- request length), i.e. how far a batch from that bucket is from homogeneous. The DP finds the
global optimum of sum(cost) for each bucket count k <= max_buckets over log-spaced histogram
bins (O(k * m^2), m = occupied bins), then picks k minimising cost/request + penalty * k.
New cuts replace the current ones only when they beat them by the hysteresis margin.
"""

from __future__ import annotations

import math

from bucketserve.scheduling.config import SchedulerConfig


def log_edges(max_len: int, bins_per_octave: int, first: int = 16) -> list[int]:
    """0, first, then bins_per_octave edges per doubling, up to max_len."""
    edges = {0, max_len}
    k = 0
    while True:
        e = int(round(first * 2 ** (k / bins_per_octave)))
        if e >= max_len:
            break
        edges.add(e)
        k += 1
    return sorted(edges)


class LengthHistogram:
    """Exponentially decayed counts (and length sums) per log-spaced bin."""

    def __init__(self, max_len: int, bins_per_octave: int, half_life_s: float) -> None:
        self.edges = log_edges(max_len, bins_per_octave)
        self.half_life_s = half_life_s
        self.weight = [0.0] * (len(self.edges) - 1)
        self.length_sum = [0.0] * (len(self.edges) - 1)
        self._t: float | None = None

    def observe(self, length: int, now: float) -> None:
        if self._t is not None and now > self._t:
            f = 0.5 ** ((now - self._t) / self.half_life_s)
            self.weight = [w * f for w in self.weight]
            self.length_sum = [s * f for s in self.length_sum]
        self._t = now if self._t is None else max(self._t, now)
        j = min(max(0, _bin(self.edges, length)), len(self.weight) - 1)
        self.weight[j] += 1.0
        self.length_sum[j] += length

    def occupied(self) -> list[tuple[int, int, float, float]]:
        """(low, high, weight, length_sum) of every bin holding mass."""
        rows = zip(self.edges, self.edges[1:], self.weight, self.length_sum, strict=False)
        return [r for r in rows if r[2] > 1e-9]


def _bin(edges: list[int], length: int) -> int:
    lo, hi = 0, len(edges) - 1
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if edges[mid] <= length:
            lo = mid
        else:
            hi = mid
    return lo


def optimal_cuts(
    bins: list[tuple[int, int, float, float]], max_buckets: int, penalty: float
) -> list[int]:
    """Cut points (bucket lows after the first) minimising padding/request + penalty * k."""
    m = len(bins)
    if m <= 1:
        return []
    w = [0.0]
    s = [0.0]
    for _, _, wi, si in bins:
        w.append(w[-1] + wi)
        s.append(s[-1] + si)

    def cost(i: int, j: int) -> float:  # one bucket over bins i..j-1, top = bins[j-1].high
        return bins[j - 1][1] * (w[j] - w[i]) - (s[j] - s[i])

    k_max = min(max_buckets, m)
    best = [[math.inf] * (m + 1) for _ in range(k_max + 1)]
    arg = [[0] * (m + 1) for _ in range(k_max + 1)]
    best[0][0] = 0.0
    for k in range(1, k_max + 1):
        for j in range(k, m + 1):
            for i in range(k - 1, j):
                c = best[k - 1][i] + cost(i, j)
                if c < best[k][j]:
                    best[k][j], arg[k][j] = c, i
    k = min(range(1, k_max + 1), key=lambda k: best[k][m] / w[m] + penalty * k)
    cuts, j = [], m
    for kk in range(k, 0, -1):
        i = arg[kk][j]
        if i > 0:
            cuts.append(bins[i][0])
        j = i
    return sorted(cuts)


def cuts_objective(
    bins: list[tuple[int, int, float, float]], cuts: list[int], penalty: float
) -> float:
    """padding/request + penalty * k for given cuts, on the histogram (tops = occupied maxima)."""
    total_w = sum(b[2] for b in bins)
    if total_w <= 0:
        return 0.0
    groups: dict[int, list[tuple[int, int, float, float]]] = {}
    for b in bins:
        groups.setdefault(sum(1 for c in cuts if c <= b[0]), []).append(b)
    pad = sum(
        max(b[1] for b in g) * sum(b[2] for b in g) - sum(b[3] for b in g) for g in groups.values()
    )
    return pad / total_w + penalty * (len(cuts) + 1)


class BoundaryPlanner:
    """Recomputes cuts every recut_interval_s; adopts them only past the hysteresis margin."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.histogram = LengthHistogram(
            config.max_model_len, config.bins_per_octave, config.histogram_half_life_s
        )
        self._last: float | None = None
        self.recuts = 0

    def observe(self, length: int, now: float) -> None:
        self.histogram.observe(length, now)

    def maybe_recut(self, now: float, current: list[int]) -> list[int] | None:
        """New cuts, or None to keep the current ones."""
        if self._last is not None and now - self._last < self.config.recut_interval_s:
            return None
        self._last = now
        bins = self.histogram.occupied()
        cfg = self.config
        new = optimal_cuts(bins, cfg.max_buckets, cfg.bucket_penalty_tokens)
        if new == current:
            return None
        old_obj = cuts_objective(bins, current, cfg.bucket_penalty_tokens)
        new_obj = cuts_objective(bins, new, cfg.bucket_penalty_tokens)
        if new_obj < (1.0 - cfg.hysteresis) * old_obj:
            self.recuts += 1
            return new
        return None
