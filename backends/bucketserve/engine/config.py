"""Engine configuration (one instance: one model, one device, one KV pool)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

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
    dtype: str = "auto"  # "auto": bfloat16 on GPUs and on CPUs with native bf16 (auto_dtype)
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
    """ "auto" -> what auto_dtype picks; any other (canonical) name -> that dtype."""
    if dtype == "auto":
        return auto_dtype(device)[0]
    return getattr(torch, dtype)


def dtype_reason(dtype: str, device: torch.device) -> str:
    """Why the engine runs `dtype` on `device`: one phrase for the start-up log."""
    if dtype == "auto":
        return "auto: " + auto_dtype(device)[1]
    return f"--dtype {dtype}"


# ISA flags with native bf16 dot products (AVX512-BF16: Zen 4+, Cooper Lake+; AMX: Sapphire
# Rapids+): oneDNN's bf16 GEMMs then read half the bytes of fp32 at full speed. Without them
# oneDNN converts bf16 in software and plain torch bf16 matmuls are far slower than fp32.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype "auto" runs on `device`, and why. GPU: bfloat16. CPU: bfloat16 when it has
    native bf16 (CPU_BF16_FLAGS) and torch has oneDNN's packed linears, else float32."""
    if device.type != "cpu":
        return torch.bfloat16, f"bf16 is native on {device.type}"
    from bucketserve.engine.fusion import is_onednn_available

    flags = cpu_bf16_flags()
    if not flags:
        from bucketserve.engine.fusion import small_linear_rows

        hint = ""
        if small_linear_rows(torch.bfloat16) > 0:  # AVX2 without AVX-512: our bf16 kernels
            hint = " (--dtype bfloat16 decodes faster here too: docs/measurements.md)"
        return torch.float32, f"the CPU lacks {' and '.join(CPU_BF16_FLAGS)}{hint}"
    if not is_onednn_available():
        return torch.float32, "this torch build lacks oneDNN's packed linears"
    return torch.bfloat16, f"the CPU has {' and '.join(flags)}"


@functools.cache
def cpu_bf16_flags() -> tuple[str, ...]:
    """Which of CPU_BF16_FLAGS this CPU has, from /proc/cpuinfo (none where it is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return tuple(f for f in CPU_BF16_FLAGS if f in flags)
