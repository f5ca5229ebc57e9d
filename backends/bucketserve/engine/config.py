"""Engine configuration (one instance: one model, one device, one KV pool)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bucketserve.engine.attention import ATTENTION_BACKENDS

DTYPE_ALIASES = {
    "auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
    "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
}  # fmt: skip


@dataclass(slots=True)
class EngineConfig:
    """What one ModelRunner loads and how big its KV pool is. None means "work it out"."""

    model: str = "smollm2"  # "smollm2", a checkpoint dir, a .gguf file, or "dummy:<shape>"
    device: str = "auto"  # "auto": cuda if available, else cpu
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on GPU
    attention: str = "auto"  # one of ATTENTION_BACKENDS
    block_size: int | None = None  # tokens per KV block; None: 256 with flash_attn, else 16
    num_blocks: int | None = None  # None: from kv_cache_gb (CPU) / gpu_memory_utilization
    kv_cache_gb: float | None = None  # pool GiB; None: 1 GiB on CPU (capped by free /dev/shm),
    # from gpu_memory_utilization on GPU
    gpu_memory_utilization: float = 0.9  # GPU: share of *total* memory this instance may use
    # (weights + activations + pool); instances sharing a GPU give shares summing to <= 1
    max_model_len: int | None = None  # None: the model's
    max_num_seqs: int = 256  # LLMEngine: decode batch cap
    max_num_batched_tokens: int = 16384  # LLMEngine: prefill batch token budget
    seed: int = 0  # dummy weights and unseeded sampling
    num_threads: int | None = None  # CPU: torch threads for this process; None: torch's default
    optimize_weights: bool = True  # fuse projections, oneDNN-pack on CPU; False: HF layout
    warm_gemms: bool = False  # oneDNN linears: run every GEMM shape once at start-up, so the
    # memory oneDNN keeps per shape is taken before serving (flat RSS after; a few seconds)
    pool_name: str | None = None  # shm / IPC name of the KV pool; None: generated
    cuda_graphs: bool = True  # GPU: replay decode steps as CUDA graphs (paged attention only)
    static_decode: bool = True  # paged attention: fixed decode buffers, incremental block tables
    enable_prefix_caching: bool = True  # LLMEngine: reuse the KV of full blocks of shared prefixes

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_ALIASES:
            raise ValueError(f"dtype must be one of {tuple(DTYPE_ALIASES)}, got {self.dtype!r}")
        self.dtype = DTYPE_ALIASES[self.dtype]
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}"
            )
        if self.device != "auto":
            torch.device(self.device)  # raises on a malformed device string
        _check_min("block_size", self.block_size, 1)
        _check_min("num_blocks", self.num_blocks, 1)
        _check_min("max_model_len", self.max_model_len, 1)
        _check_min("max_num_seqs", self.max_num_seqs, 1)
        _check_min("num_threads", self.num_threads, 1)
        _check_min("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


def _check_min(name: str, value: int | None, limit: int) -> None:
    if value is not None and value < limit:
        raise ValueError(f"{name} must be >= {limit}, got {value}")


def resolve_device(device: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """ "auto" -> float32 on CPU, bfloat16 on GPU."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, dtype)
