"""Per-request sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SEED = 2**64 - 1


@dataclass(slots=True)
class SamplingParams:
    """How one request picks tokens and when it stops. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 disables
    seed: int | None = None
    min_tokens: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= -1 (-1 or 0 disables), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")

    @property
    def is_greedy(self) -> bool:
        """Temperature 0: argmax, no randomness."""
        return self.temperature == 0

    @property
    def uses_top_k(self) -> bool:
        """Top-k filtering is on."""
        return self.top_k > 0

    @property
    def uses_top_p(self) -> bool:
        """Nucleus filtering is on."""
        return self.top_p < 1
