"""SimOutcome: what one simulated run produced."""

from __future__ import annotations

from dataclasses import dataclass, field

from bucketserve.scheduling import PrefillBatch
from bucketserve.sim.workload import SimRequest


@dataclass(slots=True)
class SimOutcome:
    """Everything a run produced (requests carry their own timestamps)."""

    policy: str
    mode: str
    requests: list[SimRequest]
    decision_s: list[float] = field(default_factory=list)
    batch_decision_s: list[float] = field(default_factory=list)
    batches: list[PrefillBatch] = field(default_factory=list)
    prefill_busy_s: float = 0.0
    decode_busy_s: float = 0.0
    preemptions: int = 0
    num_gpus: int = 1
    snapshot: dict = field(default_factory=dict)
    max_buckets: int = 1
    decision_buckets: list[int] = field(default_factory=list)
