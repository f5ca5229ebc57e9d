"""Prefill batch latency model fitted online (SCLS-style bilinear form).

    T(N, L) = p1 * N * L + p2 * N + p3 * L + p4      (N batch size, L longest prompt)

Fitted by exponentially-forgetting weighted least squares over measured batch times, with a
fixed, light prior (pseudo-observations from a tokens/s rate and a per-batch overhead) that
keeps the system well-posed when measurements cover only part of the (N, L) plane.
"""

from __future__ import annotations

PRIOR_POINTS = ((1, 16), (1, 512), (1, 4096), (8, 128), (16, 1024), (64, 64), (4, 2048))


def _features(n: int, max_len: int) -> tuple[float, float, float, float]:
    return (n * max_len, float(n), float(max_len), 1.0)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (4x4; no numpy on the decision path)."""
    m = [row[:] + [rhs] for row, rhs in zip(a, b, strict=True)]
    size = len(m)
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-300:
            continue
        for r in range(col + 1, size):
            f = m[r][col] / m[col][col]
            for c in range(col, size + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * size
    for r in range(size - 1, -1, -1):
        if abs(m[r][r]) < 1e-300:
            continue
        x[r] = (m[r][size] - sum(m[r][c] * x[c] for c in range(r + 1, size))) / m[r][r]
    return x


class BilinearLatencyModel:
    """Predicts a prefill batch's duration from its size and longest prompt."""

    def __init__(
        self,
        tokens_per_s: float,
        overhead_s: float,
        forget: float = 0.98,
        prior_weight: float = 1e-3,
    ) -> None:
        if tokens_per_s <= 0 or not 0 < forget <= 1:
            raise ValueError("tokens_per_s must be > 0 and forget in (0, 1]")
        self.forget = forget
        self._scale = (1e-4, 1e-1, 1e-3, 1.0)  # feature scaling keeps the normal equations sane
        self._prior_a, self._prior_b = self._zeros()
        for n, length in PRIOR_POINTS:
            y = overhead_s + n * length / tokens_per_s
            self._accumulate(self._prior_a, self._prior_b, _features(n, length), y, prior_weight)
        self._a, self._b = self._zeros()
        self.num_observations = 0
        self._refit()

    @staticmethod
    def _zeros() -> tuple[list[list[float]], list[float]]:
        return [[0.0] * 4 for _ in range(4)], [0.0] * 4

    def _accumulate(self, a, b, x, y: float, w: float) -> None:
        xs = [xi * si for xi, si in zip(x, self._scale, strict=True)]
        for i in range(4):
            b[i] += w * xs[i] * y
            for j in range(4):
                a[i][j] += w * xs[i] * xs[j]

    def _fit(self) -> list[float]:
        a = [
            [p + q for p, q in zip(ra, rb, strict=True)]
            for ra, rb in zip(self._prior_a, self._a, strict=True)
        ]
        b = [p + q for p, q in zip(self._prior_b, self._b, strict=True)]
        return _solve(a, b)

    def observe(self, n: int, max_len: int, seconds: float) -> None:
        """Add one measured batch (older ones fade by `forget` per observation)."""
        if n < 1 or seconds < 0:
            return
        for row in self._a:
            row[:] = [v * self.forget for v in row]
        self._b[:] = [v * self.forget for v in self._b]
        self._accumulate(self._a, self._b, _features(n, max_len), seconds, 1.0)
        self.num_observations += 1
        self._refit()

    def _refit(self) -> None:
        self._params = self._fit()
        self._eff = tuple(p * s for p, s in zip(self._params, self._scale, strict=True))

    def predict(self, n: int, max_len: int) -> float:
        """Predicted seconds for a batch of n prompts, the longest max_len tokens."""
        p1, p2, p3, p4 = self._eff
        return max(p1 * n * max_len + p2 * n + p3 * max_len + p4, 1e-4)

    def single(self) -> tuple[float, float]:
        """(a, b) with predict(1, L) = a + b * L (before the floor): one-request batches."""
        p1, p2, p3, p4 = self._eff
        return p2 + p4, p1 + p3

    @property
    def params(self) -> tuple[float, ...]:
        """(p1, p2, p3, p4) in seconds per N*L, per request, per token, per batch."""
        return self._eff
