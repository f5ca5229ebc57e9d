"""GPU and model specs the roofline latency model and the KV pool sizes are computed from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class GpuSpec:
    """Peak numbers of one accelerator."""

    name: str
    flops: float  # dense bf16/fp16 FLOP/s
    bandwidth: float  # HBM bytes/s
    memory: float  # bytes
    link_bandwidth: float  # effective GPU-to-GPU bytes/s for the KV hand-off
    sms: int = 108  # streaming multiprocessors (Bullet's SM-partition model)
    bandwidth_sms: int = 30  # SMs that saturate HBM bandwidth (Bullet's N_d; ~30 on A100)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """Decoder-only transformer shape (Llama family)."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    max_len: int = 4096

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


# A100 SXM 40GB: 312 TFLOP/s dense bf16, 1.555 TB/s HBM2, 40 GiB (not 40e9 B: that lost 26 %
# of the KV pool), 108 SMs; NVLink3 600 GB/s total (300 per direction), of which we assume
# 150 GB/s effective for one hand-off stream.
A100_40GB = GpuSpec(
    "A100-40GB", flops=312e12, bandwidth=1.555e12, memory=40 * 2**30, link_bandwidth=150e9
)
# H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB (decimal, as sold), 132 SMs.
H200 = GpuSpec(
    "H200", flops=989e12, bandwidth=4.8e12, memory=141e9, link_bandwidth=300e9, sms=132,
    bandwidth_sms=40,
)  # fmt: skip

# Llama-2-13B: 13,015,864,320 parameters, 40 layers, hidden 5120, 40 heads (MHA), head_dim 128.
LLAMA2_13B = ModelSpec("Llama-2-13B", 13.016e9, 40, 5120, 40, 40, 128, 2, 4096)
# Llama-3-8B: 8.03e9 parameters, 32 layers, hidden 4096, 32 heads, 8 KV heads (GQA).
LLAMA3_8B = ModelSpec("Llama-3-8B", 8.03e9, 32, 4096, 32, 8, 128, 2, 8192)

GPUS = {"a100-40gb": A100_40GB, "h200": H200}
MODELS = {"llama-2-13b": LLAMA2_13B, "llama-3-8b": LLAMA3_8B}


def kv_pool_blocks(
    gpu: GpuSpec, model: ModelSpec, block_size: int, tp: int = 1, util: float = 0.9
) -> int:
    """KV blocks per instance, vLLM-style: util x memory - weights, over tp GPUs."""
    free = tp * (util * gpu.memory) - model.weight_bytes
    if free <= 0:
        raise ValueError(f"{model.name} does not fit {tp} x {gpu.name} at util={util}")
    return int(free // (block_size * model.kv_bytes_per_token))
