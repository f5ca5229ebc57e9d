"""Global Monitor: live cluster and queue numbers the controller and scheduler act on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bucketserve.scheduling.cluster import ClusterView, InstanceStats


class Ema:
    """Exponential moving average; `value` is None until the first sample."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value


@dataclass(slots=True)
class MonitorSnapshot:
    """One reading of the monitor (what `sched.snapshot()` returns)."""

    policy: str
    time_s: float
    num_waiting: int
    free_blocks: dict[str, int]
    total_blocks: dict[str, int]
    bucket_boundaries: list[tuple[int, int]]
    queue_per_bucket: list[int]
    arrival_rate: float
    mean_prompt_len: float
    batch_latency_s: float
    padding_ratio: float
    decisions: int
    batches: int
    mean_decision_us: float
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bucket_boundaries"] = [list(b) for b in self.bucket_boundaries]
        return d


class GlobalMonitor:
    """Collects arrival rate, lengths, per-instance free blocks, batch latency and padding."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.instances: dict[str, InstanceStats] = {}
        self._gap = Ema(alpha)
        self._prompt = Ema(alpha)
        self._latency = Ema(alpha)
        self._padding = Ema(alpha)
        self._last_arrival: float | None = None
        self.decisions = 0
        self.batches = 0
        self._decision_s = 0.0

    def observe_arrival(self, arrival_s: float, prompt_len: int) -> None:
        if self._last_arrival is not None:
            self._gap.add(max(arrival_s - self._last_arrival, 0.0))
        self._last_arrival = arrival_s
        self._prompt.add(prompt_len)

    def observe_view(self, view: ClusterView) -> None:
        for stats in (*view.prefill, *view.decode):
            self.instances[stats.instance_id] = stats

    def record_decision(self, seconds: float, padding_ratio: float | None) -> None:
        self.decisions += 1
        self._decision_s += seconds
        if padding_ratio is not None:
            self.batches += 1
            self._padding.add(padding_ratio)

    def record_batch_latency(self, seconds: float) -> None:
        self._latency.add(seconds)

    @property
    def arrival_rate(self) -> float:
        gap = self._gap.value
        return 0.0 if not gap else 1.0 / gap

    @property
    def mean_decision_us(self) -> float:
        return 1e6 * self._decision_s / self.decisions if self.decisions else 0.0

    def snapshot(self, policy: str, now: float, buckets, num_waiting: int) -> MonitorSnapshot:
        """`buckets` is the BucketManager (boundaries and queue lengths come from it)."""
        return MonitorSnapshot(
            policy=policy,
            time_s=now,
            num_waiting=num_waiting,
            free_blocks={k: s.free_blocks for k, s in self.instances.items()},
            total_blocks={k: s.total_blocks for k, s in self.instances.items()},
            bucket_boundaries=buckets.boundaries(),
            queue_per_bucket=buckets.queue_lengths(),
            arrival_rate=self.arrival_rate,
            mean_prompt_len=self._prompt.value or 0.0,
            batch_latency_s=self._latency.value or 0.0,
            padding_ratio=self._padding.value or 0.0,
            decisions=self.decisions,
            batches=self.batches,
            mean_decision_us=self.mean_decision_us,
        )
