"""The Global Monitor's input: every engine instance's shared-memory stats block, read cheaply."""

from __future__ import annotations

from bucketserve.kv.names import shm_name
from bucketserve.kv.stats import StatsBlock
from bucketserve.scheduling import ClusterView, InstanceStats
from bucketserve.serving.config import ServeConfig


class ClusterStats:
    """Opens the prefill and decode stats blocks lazily (their models may still be loading)."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.names = {
            ("prefill", i): shm_name(cfg.run_id, "prefill", i, "st")
            for i in range(len(cfg.engine_prefill_devices))
        } | {
            ("decode", i): shm_name(cfg.run_id, "decode", i, "st")
            for i in range(len(cfg.decode_devices))
        }
        self.blocks: dict[tuple[str, int], StatsBlock] = {}

    def ready(self) -> bool:
        for key, name in self.names.items():
            if key not in self.blocks:
                try:
                    self.blocks[key] = StatsBlock.open(name)
                except FileNotFoundError:
                    return False
        return True

    def view(self) -> ClusterView | None:
        """A ClusterView of all instances, or None until every instance has published."""
        if not self.ready():
            return None
        roles: dict[str, list[InstanceStats]] = {"prefill": [], "decode": []}
        for (role, index), block in sorted(self.blocks.items()):
            s = block.read()
            if not s.heartbeat:  # created but not yet published
                return None
            roles[role].append(
                InstanceStats(
                    instance_id=f"{role}{index}",
                    role=role,
                    total_blocks=s.total_blocks,
                    free_blocks=s.free_blocks,
                    block_size=s.block_size,
                    running=s.running + s.waiting,
                    step_latency_s=s.step_latency_ema_s,
                    kv_bytes_per_token=s.kv_bytes_per_token,
                    pending_handoffs=s.pending_handoffs,
                    num_received=s.num_received,
                    prefill_backlog=s.prefill_backlog,
                )
            )
        return ClusterView(prefill=roles["prefill"], decode=roles["decode"])

    def snapshot(self) -> dict[str, object]:
        """Raw stats per instance (for metrics), keyed by instance id."""
        if not self.ready():
            return {}
        return {f"{role}{i}": block.read() for (role, i), block in self.blocks.items()}

    def close(self) -> None:
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
