"""Mean and 95 % confidence interval over seeds (Student's t; no scipy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % CI); half-width nan for fewer than two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def fmt_ci(values: Sequence[float], digits: int = 2) -> str:
    """'m ± h' (or 'm' for one value)."""
    m, h = mean_ci(values)
    if math.isnan(m):
        return "—"
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"
