"""What the Global Monitor reads from the engine instances: one stats record per instance."""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("prefill", "decode", "mixed")


@dataclass(slots=True)
class InstanceStats:
    """Live numbers one engine instance publishes (free KV blocks, running sequences, speed)."""

    instance_id: str
    role: str
    total_blocks: int
    free_blocks: int
    block_size: int
    running: int
    step_latency_s: float
    kv_bytes_per_token: int
    pending_handoffs: int = 0
    num_received: int = 0  # requests the instance has taken in (colocated gating)
    prefill_backlog: int = 0  # prompt tokens there whose KV is not computed yet

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0 <= self.free_blocks <= self.total_blocks:
            raise ValueError(
                f"free_blocks must be in [0, total_blocks={self.total_blocks}], got {self.free_blocks}"
            )

    @property
    def free_bytes(self) -> int:
        """Free KV memory in bytes (the monitor's 'free GPU memory after weights')."""
        return self.free_blocks * self.block_size * self.kv_bytes_per_token


@dataclass(slots=True)
class ClusterView:
    """All instances at one instant.

    `prefill` lists the instances that may start a prefill batch now (the caller leaves busy
    ones out, or calls only when its prefill instance is idle); `decode` lists every decode
    instance. An instance whose id appears in both lists is aggregated (prefill and decode on
    the same device): its batch stays on it.
    """

    prefill: list[InstanceStats] = field(default_factory=list)
    decode: list[InstanceStats] = field(default_factory=list)
