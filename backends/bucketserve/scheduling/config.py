"""SchedulerConfig: one validated record of every scheduling knob, with the defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields

from bucketserve.scheduling.placement import DECODE_BALANCES

RESERVE_MODES = ("none", "expected", "max")
ADMISSIONS = ("headroom", "prefill")
OFFLINE_ORDERS = ("sjf", "ljf")


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


@dataclass(slots=True)
class SchedulerConfig:
    """Knobs for every policy; each policy reads only the ones it needs.

    Shared: `max_wait_s` is the starvation bound (a request waiting longer is served next,
    memory permitting); `watermark` is the share of each decode pool kept free (vLLM's);
    `output_reserve` says how many output tokens admission reserves per request on the decode
    side: "none" (one token; growth on demand, vLLM-style), "expected" (learned mean output),
    "max" (max_tokens, never preempts); None takes the policy's default.
    """

    max_model_len: int
    block_size: int
    max_wait_s: float = 30.0
    watermark: float = 0.01
    output_reserve: str | None = None
    expected_output_tokens: int = 128
    max_num_seqs: int = 256
    # every policy: prefill tokens per batch (None: no cap; one longer prompt still runs alone)
    max_prefill_tokens: int | None = None
    # decode placement with several decode instances (scheduling/placement.py)
    decode_balance: str = "maxmin"
    # bucketserve (faithful): Eq. 6 safety factor and the offline order inside buckets
    memory_safety: float = 0.9
    offline_order: str = "sjf"
    # bucketserve (faithful) ablations, each turns one component off:
    enable_bucketing: bool = True  # False: one bucket for all lengths (no Algorithm 1)
    enable_batch_controller: bool = True  # False: static_batch_size instead of Eq. 6
    enable_priority: bool = True  # False: oldest request first, online or not; FCFS inside
    bucket_cap: int | None = None  # not in the paper: stop Algorithm 1 splitting at this many
    # the seed buckets "based on its sequence length and task type": one Algorithm 1 per type
    bucket_by_task_type: bool = True
    # admission: "headroom" (prefill pool and decode headroom) or "prefill" (DistServe's:
    # prefill pool only); None: the policy's default (distserve, sjf, edf, bullet: prefill)
    admission: str | None = None
    # fcfs / distserve: prefill token budget per batch (None: max(max_model_len, 2048), vLLM's)
    max_batched_tokens: int | None = None
    max_paddings: int = 256  # fcfs-pad: padded-era vLLM's cap on padding tokens per batch
    bullet_urgent_s: float = 0.1  # bullet: TTFT slack below which a request jumps the order
    scls_slice_tokens: int = 128  # scls: output tokens per generation slice
    scls_step_prior_s: float = 0.03  # scls: decode-step time before any was measured
    # static (and bucketserve without its batch controller): fixed batch size
    static_batch_size: int = 32
    # bucketserve+: boundaries, batch cap, EDF scan depth, latency-model prior
    max_buckets: int = 8
    plus_max_batch_tokens: int = 8192
    histogram_half_life_s: float = 30.0
    recut_interval_s: float = 2.0
    hysteresis: float = 0.1
    bucket_penalty_tokens: float = 32.0
    bins_per_octave: int = 4
    edf_scan: int = 64
    prefill_tokens_per_s: float = 5000.0
    prefill_overhead_s: float = 0.02

    @classmethod
    def with_overrides(cls, overrides: dict, **derived) -> SchedulerConfig:
        """A config from `derived` values (context length, block size...) plus user overrides;
        unknown names, overrides of derived values and non-boolean switches raise ValueError."""
        known = {f.name for f in fields(cls)} - set(derived)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"scheduler: unknown option(s) {unknown}; known: {', '.join(sorted(known))}"
            )
        for f in fields(cls):
            if f.type == "bool" and not isinstance(overrides.get(f.name, True), bool):
                raise ValueError(f"scheduler.{f.name} must be true or false")
        return cls(**derived, **overrides)

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_wait_s <= 0:
            raise ValueError(f"max_wait_s must be > 0, got {self.max_wait_s}")
        _check_range("watermark", self.watermark, 0.0, 0.5)
        _check_range("memory_safety", self.memory_safety, 0.01, 1.0)
        _check_range("hysteresis", self.hysteresis, 0.0, 0.9)
        if self.output_reserve is not None and self.output_reserve not in RESERVE_MODES:
            raise ValueError(f"output_reserve must be one of {RESERVE_MODES} or None")
        if self.admission is not None and self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS} or None")
        if self.decode_balance not in DECODE_BALANCES:
            raise ValueError(f"decode_balance must be one of {DECODE_BALANCES}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.offline_order not in OFFLINE_ORDERS:
            raise ValueError(f"offline_order must be one of {OFFLINE_ORDERS}")
        self._check_counts()

    def _check_counts(self) -> None:
        for name in (
            "expected_output_tokens", "max_num_seqs", "static_batch_size", "edf_scan",
            "scls_slice_tokens",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        _check_range("max_buckets", self.max_buckets, 1, 64)
        if self.bucket_cap is not None and self.bucket_cap < 1:
            raise ValueError(f"bucket_cap must be >= 1 or None, got {self.bucket_cap}")
        _check_range("bins_per_octave", self.bins_per_octave, 1, 16)
        if self.max_batched_tokens is not None and self.max_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_batched_tokens must be >= max_model_len={self.max_model_len}, "
                f"got {self.max_batched_tokens}"
            )
        if self.plus_max_batch_tokens < self.max_model_len:
            raise ValueError(
                f"plus_max_batch_tokens must be >= max_model_len={self.max_model_len}, "
                f"got {self.plus_max_batch_tokens}"
            )
        for name in ("histogram_half_life_s", "recut_interval_s", "prefill_tokens_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("prefill_overhead_s", "bucket_penalty_tokens", "max_paddings"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("bullet_urgent_s", "scls_step_prior_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def token_budget(self) -> int:
        """The fcfs/distserve prefill token budget per batch."""
        return self.max_batched_tokens or max(self.max_model_len, 2048)
