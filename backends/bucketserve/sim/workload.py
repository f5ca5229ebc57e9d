"""Synthetic workloads: Alpaca-like, LongBench-like and Mixed lengths; Poisson or bursty arrivals.

The length distributions are the one workload model in bucketserve.bench.workloads, which the
load generator draws from too (lognormal, parameters from median and mean: mu = ln median,
sigma^2 = 2 ln(mean / median)); these are the simulator's numbers, kept as they were because
docs/scheduling.md's tables were computed with them:
* Alpaca prompts: median 69, mean 83.7 tokens (the paper's statistics).
* LongBench prompts: median 41,417, mean 55,749.3 (the paper's statistics), then truncated to
  the model context minus max_tokens (4096 - 512 = 3584 for Llama-2), so ~99.9 % hit the cap.
* Outputs (our assumption; the paper gives none): Alpaca median 96 / mean 128, LongBench
  median 256 / mean 300 tokens, capped at max_tokens = 512, at least 2.
  (The simulator draws them raw, `LengthDist.draw`, and clips them to its spec as above.)
* Mixed: each request is LongBench-like with probability long_fraction (default 0.1, the
  paper-scale tables; the CPU load runs use 0.2, bench.workloads.MIXED_LONG_SHARE).
SLO class: every request `slo_class`, or offline with probability offline_fraction (drawn
from a second seeded stream, so lengths and arrival times do not change with it).
Arrivals: Poisson, or Gamma inter-arrival times with CV > 1 (bursty).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bucketserve.bench.workloads import (
    ALPACA_OUTPUT,
    ALPACA_PROMPT,
    LONGBENCH_OUTPUT,
    LONGBENCH_PROMPT,
)
from bucketserve.scheduling import DEFAULT_SLOS, RequestMeta

WORKLOADS = ("alpaca", "longbench", "mixed", "phased")
# phased: the mix switches every PHASE_S seconds between a long-heavy phase (this share of
# LongBench-like requests) and an Alpaca-only one; the mean share is Mixed's 0.1 x 1.25
PHASE_S = 120.0
PHASE_LONG_SHARES = (0.25, 0.0)
ARRIVALS = ("poisson", "gamma")


@dataclass(slots=True)
class WorkloadSpec:
    """What to generate; validated at construction."""

    name: str = "mixed"
    num_requests: int = 300
    rate: float = 4.0
    arrival: str = "poisson"
    cv: float = 2.0
    long_fraction: float = 0.1
    max_model_len: int = 4096
    max_tokens: int = 512
    slo_class: str = "online"
    seed: int = 0
    offline_fraction: float = 0.0  # > 0: this share of requests is offline, the rest online
    ttft_scale: float = 1.0  # x the class's default TTFT SLO (the SLO grid's TTFT axis)
    tpot_s: float | None = None  # TPOT SLO (None: the class's default)

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.name!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.num_requests < 1 or self.rate <= 0 or self.cv <= 0:
            raise ValueError("num_requests must be >= 1, rate > 0 and cv > 0")
        for name in ("long_fraction", "offline_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.ttft_scale <= 0 or (self.tpot_s is not None and self.tpot_s <= 0):
            raise ValueError(f"ttft_scale and tpot_s must be > 0, got {self.ttft_scale}, "
                             f"{self.tpot_s}")  # fmt: skip
        if self.max_tokens >= self.max_model_len:
            raise ValueError(f"max_tokens must be < max_model_len={self.max_model_len}")

    @property
    def prompt_cap(self) -> int:
        return self.max_model_len - self.max_tokens


@dataclass(slots=True)
class SimRequest:
    """A request plus its hidden true output length and the times the simulator records."""

    meta: RequestMeta
    output_len: int
    scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    preemptions: int = 0
    extra: dict = field(default_factory=dict)
    last_token_s: float = math.nan
    # gaps between output tokens, counted against the request's TPOT SLO as they happen (a
    # per-token tail SLO needs only these counts, not every gap)
    num_gaps: int = 0
    num_slow_gaps: int = 0
    max_gap_s: float = 0.0
    prompt_ids: list[int] | None = None  # token ids, where prefixes matter (else all zeros)

    def record_token(self, now: float) -> None:
        """One output token exists at `now` (the first one sets first_token_s)."""
        last = self.last_token_s
        if last == last:  # not nan: a gap since the previous token
            gap = now - last
            self.num_gaps += 1
            if gap > self.meta.tpot_slo_s:
                self.num_slow_gaps += 1
            if gap > self.max_gap_s:
                self.max_gap_s = gap
        elif self.first_token_s != self.first_token_s:
            self.first_token_s = now
        self.last_token_s = now

    def tail_gap_ok(self, q: float = 0.9) -> bool:
        """The q-quantile (nearest rank) of its gaps is within the TPOT SLO: at most
        n - ceil(q n) gaps are slower than it."""
        return self.num_slow_gaps <= self.num_gaps - math.ceil(q * self.num_gaps - 1e-9)


def arrival_times(
    rng: np.random.Generator, n: int, rate: float, kind: str, cv: float
) -> np.ndarray:
    if kind == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    return np.cumsum(gaps) - gaps[0]


def long_share(spec: WorkloadSpec, times: np.ndarray) -> np.ndarray | float:
    """Probability that each request (by arrival time) is LongBench-like."""
    if spec.name == "phased":
        phase = (times // PHASE_S).astype(int) % len(PHASE_LONG_SHARES)
        return np.asarray(PHASE_LONG_SHARES)[phase]
    return {"alpaca": 0.0, "longbench": 1.0, "mixed": spec.long_fraction}[spec.name]


def _lengths(spec: WorkloadSpec, rng: np.random.Generator):
    """Both length draws for every request (so the seed's stream does not depend on the mix),
    the arrival times, and which requests are long."""
    n = spec.num_requests
    u = rng.random(n)
    long_prompt, short_prompt = LONGBENCH_PROMPT.draw(rng, n), ALPACA_PROMPT.draw(rng, n)
    long_out, short_out = LONGBENCH_OUTPUT.draw(rng, n), ALPACA_OUTPUT.draw(rng, n)
    times = arrival_times(rng, n, spec.rate, spec.arrival, spec.cv)
    is_long = u < long_share(spec, times)
    prompt = np.clip(np.rint(np.where(is_long, long_prompt, short_prompt)), 1, spec.prompt_cap)
    out = np.clip(np.rint(np.where(is_long, long_out, short_out)), 2, spec.max_tokens)
    return prompt.astype(int), out.astype(int), is_long, times


def make_requests(spec: WorkloadSpec) -> list[SimRequest]:
    """The request list for one run (deterministic for spec.seed)."""
    rng = np.random.default_rng(spec.seed)
    prompt, out, is_long, times = _lengths(spec, rng)
    classes = [spec.slo_class] * spec.num_requests
    if spec.offline_fraction > 0:
        draws = np.random.default_rng([spec.seed, 1]).random(spec.num_requests)
        classes = ["offline" if d < spec.offline_fraction else "online" for d in draws]
    reqs, ttft_scale = [], spec.ttft_scale
    for i in range(spec.num_requests):
        meta = RequestMeta(
            request_id=f"r{i}",
            prompt_len=int(prompt[i]),
            max_tokens=spec.max_tokens,
            arrival_s=float(times[i]),
            slo_class=classes[i],
            ttft_slo_s=ttft_scale * DEFAULT_SLOS[classes[i]].ttft_for(int(prompt[i])),
            tpot_slo_s=spec.tpot_s or DEFAULT_SLOS[classes[i]].tpot_s,
            task_type="summarization" if is_long[i] else "chat",
        )
        reqs.append(SimRequest(meta, int(out[i])))
    return reqs
