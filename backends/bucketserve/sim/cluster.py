"""ClusterSpec: how many instances of which kind, and how big their KV pools are."""

from __future__ import annotations

from dataclasses import dataclass

from bucketserve.scheduling import SchedulerConfig
from bucketserve.scheduling.prefix_index import BALANCE_TOKENS
from bucketserve.sim.hardware import GpuSpec, ModelSpec, kv_pool_blocks

# pd: prefill instances hand KV to decode instances; aggregated: vLLM-like, a prefill
# iteration pauses decode; chunked: Sarathi-style hybrid iterations under a token budget;
# bullet: prefill and decode run concurrently on one GPU's SMs; scls: slice-level batches;
# hybrid: chunked instances with their own budgets (chunk_budgets; 0 = decode-only)
TOPOLOGIES = ("auto", "pd", "aggregated", "chunked", "bullet", "scls", "hybrid")
_AUTO = {"static": "static", "fcfs": "aggregated", "bullet": "bullet", "scls": "scls"}
# DistServe checks only its prefill pool at admission (the server's distserve does not, as
# its decode side fails hand-offs that wait too long for blocks)
SIM_ADMISSION = {"distserve": "prefill"}
# chunked: who picks the instance for a prompt. pull: an instance with room asks the policy
# for its next batch; least_loaded / prefix_aware: the server's colocated placement
# (least loaded first / by cached overlap vs load, sim/prefix.py)
PLACEMENTS = ("pull", "least_loaded", "prefix_aware")


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
    chunk_tokens: int = 512  # chunked: Sarathi's per-iteration token budget
    bullet_tpot_share: float = 0.5  # bullet: decode's SMs meet this share of the TPOT SLO
    chunk_budgets: tuple[int, ...] = ()  # hybrid: one per instance (() = chunk_tokens each)
    adaptive_roles: bool = False  # hybrid: scheduling.roles.RoleController resets the budgets
    prefix_caching: bool = False  # the engines' prefix cache (requests need prompt_ids)
    placement: str = "pull"  # chunked topology only (PLACEMENTS)
    balance_tokens: float = BALANCE_TOKENS  # prefix_aware: load gap beyond which load wins

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {self.topology!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.placement != "pull" and self.topology != "chunked":
            raise ValueError(f"placement={self.placement!r} needs topology 'chunked'")
        if self.chunk_budgets and (
            len(self.chunk_budgets) != self.num_aggregated
            or min(self.chunk_budgets) < 0
            or max(self.chunk_budgets) < 1
        ):
            raise ValueError(
                f"chunk_budgets must hold num_aggregated={self.num_aggregated} "
                f"budgets >= 0, one > 0, got {self.chunk_budgets}"
            )
        if not 0 < self.bullet_tpot_share <= 1:
            raise ValueError(f"bullet_tpot_share must be in (0, 1], got {self.bullet_tpot_share}")
        for name in (
            "kv_blocks",
            "kv_bytes_per_token",
            "block_size",
            "num_prefill",
            "num_decode",
            "num_aggregated",
            "chunk_tokens",
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
        """The deployment this policy runs on (see TOPOLOGIES; "static": HF-style batches)."""
        if policy == "static":
            return "static" if self.topology != "pd" else "pd"
        if self.topology == "auto":
            return _AUTO.get(policy, "pd")
        return self.topology

    def num_gpus(self, policy: str) -> int:
        mode = self.mode_for(policy)
        instances = self.num_prefill + self.num_decode if mode == "pd" else self.num_aggregated
        return instances * self.gpus_per_instance

    def scheduler_config(
        self, max_model_len: int, overrides: dict | None = None, policy: str = ""
    ) -> SchedulerConfig:
        """The scheduler config every simulated run uses, plus `overrides`.

        memory_safety = 1.0: the KV pool is already 0.9 x GPU memory minus weights (vLLM's
        gpu_memory_utilization), which is Eq. 5's M_safe; Eq. 6's 0.9 applied on top of it
        would take the safety factor twice.
        """
        base = {"max_num_seqs": self.max_num_seqs, "memory_safety": 1.0}
        if policy in SIM_ADMISSION:
            base["admission"] = SIM_ADMISSION[policy]
        return SchedulerConfig.with_overrides(
            base | (overrides or {}), max_model_len=max_model_len, block_size=self.block_size
        )
