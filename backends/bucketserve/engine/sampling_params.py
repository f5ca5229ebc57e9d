"""Per-request sampling parameters: the one record that travels from the contract to the sampler."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SEED = 2**64 - 1
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_PENALTY = 2.0  # OpenAI's presence/frequency penalty range is [-2, 2]
# What `guide` holds for each guide_type: a JSON schema, nothing (any JSON object), a regex, a
# JSON list of strings, an EBNF grammar (xgrammar's dialect). engine/guided.py compiles them.
GUIDE_TYPES = ("", "json", "json_object", "regex", "choice", "grammar")


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
    repetition_penalty: float = 1.0  # HF style, on prompt and output tokens; 1 disables
    presence_penalty: float = 0.0  # OpenAI style, on output tokens
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's plus k alternatives
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # token sequences that must not be produced
    guide_type: str = ""  # structured output: one of GUIDE_TYPES ("" is unconstrained)
    guide: str = ""

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
        self._check_penalties()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        self.bad_words_ids = tuple(tuple(int(t) for t in w) for w in self.bad_words_ids if w)
        self._check_guide()

    def _check_guide(self) -> None:
        """Shape only; whether the schema / regex / grammar compiles is engine/guided.py's."""
        if self.guide_type not in GUIDE_TYPES:
            raise ValueError(f"guide_type must be one of {GUIDE_TYPES}, got {self.guide_type!r}")
        needs_guide = self.guide_type not in ("", "json_object")
        if needs_guide and not self.guide:
            raise ValueError(f"guide must not be empty for guide_type {self.guide_type!r}")
        if not needs_guide and self.guide:
            raise ValueError(f"guide must be empty for guide_type {self.guide_type!r}")

    def _check_penalties(self) -> None:
        if not 0 < self.repetition_penalty <= 10:  # also rejects NaN
            raise ValueError(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")

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

    @property
    def uses_penalties(self) -> bool:
        """Some penalty depends on the tokens seen so far."""
        return (
            self.repetition_penalty != 1
            or self.presence_penalty != 0
            or self.frequency_penalty != 0
        )

    @property
    def is_guided(self) -> bool:
        """Structured output: a grammar masks every sampled token."""
        return self.guide_type != ""

    @property
    def guide_key(self) -> tuple[str, str]:
        """What a compiled grammar is cached under."""
        return self.guide_type, self.guide

    def is_stop_token(self, token: int, eos_token_ids) -> bool:
        """`token` ends the request (EOS unless ignored, or a stop id); min_tokens is the
        sampler's job: it masks these ids until then."""
        return token in self.stop_token_ids or (not self.ignore_eos and token in eos_token_ids)
