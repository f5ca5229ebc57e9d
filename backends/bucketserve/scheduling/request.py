"""Gateway metadata: what the scheduler knows about a request when it arrives."""

from __future__ import annotations

import math
from dataclasses import dataclass

SLO_CLASSES = ("online", "offline")


@dataclass(slots=True, frozen=True)
class SloDefaults:
    """TTFT/TPOT targets used when a request names none.

    TTFT is normalised per prompt token (Bullet-style) with a floor, so one rule covers short
    chat prompts and long summarisation prompts: ttft = max(floor, per_token * prompt_len).
    Online: DistServe's OPT-13B chatbot pair (TTFT 0.25 s, TPOT 0.1 s) as the floor, 1.5 ms per
    prompt token (Bullet's arXiv-summary value). Offline: throughput jobs, 20x looser TTFT and
    5x looser TPOT (our choice; the BucketServe paper states no SLO values).
    """

    ttft_floor_s: float
    ttft_per_token_s: float
    tpot_s: float

    def ttft_for(self, prompt_len: int) -> float:
        return max(self.ttft_floor_s, self.ttft_per_token_s * prompt_len)


DEFAULT_SLOS: dict[str, SloDefaults] = {
    "online": SloDefaults(ttft_floor_s=0.25, ttft_per_token_s=1.5e-3, tpot_s=0.1),
    "offline": SloDefaults(ttft_floor_s=5.0, ttft_per_token_s=30e-3, tpot_s=0.5),
}


@dataclass(slots=True)
class RequestMeta:
    """One request as tagged by the gateway: length, budget, arrival, SLO class and targets."""

    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_s: float
    slo_class: str = "online"
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    task_type: str = ""
    num_cached_tokens: int = 0  # prompt tokens probably cached where it will run (an estimate)

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if not 0 <= self.num_cached_tokens < self.prompt_len:
            raise ValueError(
                f"num_cached_tokens must be in [0, prompt_len={self.prompt_len}), "
                f"got {self.num_cached_tokens}"
            )
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.arrival_s):
            raise ValueError(f"arrival_s must be finite, got {self.arrival_s}")
        if self.slo_class not in SLO_CLASSES:
            raise ValueError(f"slo_class must be one of {SLO_CLASSES}, got {self.slo_class!r}")
        slo = DEFAULT_SLOS[self.slo_class]
        if self.ttft_slo_s is None:
            self.ttft_slo_s = slo.ttft_for(self.prompt_len)
        if self.tpot_slo_s is None:
            self.tpot_slo_s = slo.tpot_s
        if self.ttft_slo_s <= 0 or self.tpot_slo_s <= 0:
            raise ValueError(
                f"ttft_slo_s and tpot_slo_s must be > 0, got {self.ttft_slo_s}, {self.tpot_slo_s}"
            )

    @property
    def bucket_len(self) -> int:
        """The length buckets sort it by: what prefill computes, the uncached part (memory
        and SLOs still count the whole prompt)."""
        return self.prompt_len - self.num_cached_tokens

    @property
    def is_online(self) -> bool:
        return self.slo_class == "online"

    @property
    def ttft_deadline_s(self) -> float:
        """Absolute time by which the first token must exist to meet the TTFT SLO."""
        return self.arrival_s + self.ttft_slo_s
