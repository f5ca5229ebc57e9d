"""ClusterSpec: how many instances of which kind, and how big their KV pools are."""

from __future__ import annotations

from dataclasses import dataclass

from bucketserve.sim.hardware import GpuSpec, ModelSpec, kv_pool_blocks

TOPOLOGIES = ("auto", "pd", "aggregated")


@dataclass(slots=True)
class ClusterSpec:
    """Instances and pools. Topology "auto": static -> aggregated static batches (UELLM-like),
    fcfs -> aggregated continuous batching (vLLM-like), others -> disaggregated P/D."""

    kv_blocks: int
    kv_bytes_per_token: int
    block_size: int = 16
    num_prefill: int = 2
    num_decode: int = 2
    num_aggregated: int = 4
    max_num_seqs: int = 256
    padded_prefill: bool = False
    topology: str = "auto"
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {self.topology!r}")
        for name in (
            "kv_blocks",
            "kv_bytes_per_token",
            "block_size",
            "num_prefill",
            "num_decode",
            "num_aggregated",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def for_hardware(
        cls, model: ModelSpec, gpu: GpuSpec, tp: int = 1, block_size: int = 16, **kw
    ) -> ClusterSpec:
        blocks = kv_pool_blocks(gpu, model, block_size, tp)
        return cls(blocks, model.kv_bytes_per_token, block_size, gpus_per_instance=tp, **kw)

    def mode_for(self, policy: str) -> str:
        """ "static", "aggregated" or "pd" for this policy."""
        if policy == "static":
            return "static" if self.topology != "pd" else "pd"
        if self.topology == "auto":
            return "aggregated" if policy == "fcfs" else "pd"
        return self.topology

    def num_gpus(self, policy: str) -> int:
        mode = self.mode_for(policy)
        instances = self.num_prefill + self.num_decode if mode == "pd" else self.num_aggregated
        return instances * self.gpus_per_instance
