"""Attention backends over the paged KV cache, and the registry that picks one.

`base` holds what they share (metadata, KV store, the mixed decode + prefill-chunk forward);
one module per backend: `flash` (flash-attn, GPU), `triton_paged` (Triton paged decode, GPU or
interpreted), `cpu_paged` (C++ paged decode, CPU float32 or bfloat16) and `sdpa` (torch SDPA, anywhere).
Backend modules import `base`, never this module, so there is no import circle.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch

from bucketserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    DecodeGroup,
    store_kv,
)

__all__ = [
    "ATTENTION_BACKENDS", "AttentionBackend", "AttentionMetadata", "DecodeGroup",
    "block_size_for", "is_flash_attn_available", "make_backend", "resolve_backend_name",
    "store_kv",
]  # fmt: skip

ATTENTION_BACKENDS = ("auto", "flash_attn", "cpu_paged", "sdpa", "triton")
FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged KV wants page sizes divisible by 256
FLASH_DTYPES = (torch.float16, torch.bfloat16)
_REGISTRY = {  # resolved name -> (module, class)
    "flash_attn": ("bucketserve.engine.attention.flash", "FlashAttnBackend"),
    "cpu_paged": ("bucketserve.engine.attention.cpu_paged", "CpuPagedBackend"),
    "triton": ("bucketserve.engine.attention.triton_paged", "TritonBackend"),
    "sdpa": ("bucketserve.engine.attention.sdpa", "SdpaBackend"),
}


def is_flash_attn_available() -> bool:
    """flash-attn importable (it only runs on CUDA)."""
    return importlib.util.find_spec("flash_attn") is not None


def resolve_backend_name(
    requested: str, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> str:
    """The backend `requested` ("auto" or a name) resolves to on `device` for `dtype`.

    flash-attn only where it is already importable: it cannot be installed everywhere
    (docs/platform-notes.md#p15-flash-attn-not-installable).
    """
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    can_flash = device.type == "cuda" and dtype in FLASH_DTYPES and is_flash_attn_available()
    if requested == "auto":
        if can_flash:
            return "flash_attn"
        return "cpu_paged" if _cpu_paged_problem(device, dtype) is None else "sdpa"
    if requested == "flash_attn" and not can_flash:
        raise ValueError(
            "attention='flash_attn' needs a CUDA device, dtype float16/bfloat16 and the "
            "flash_attn package"
        )
    if requested == "cpu_paged" and (problem := _cpu_paged_problem(device, dtype)):
        raise ValueError(f"attention='cpu_paged' {problem}")
    if requested == "triton" and (problem := _triton_problem(device)):
        raise ValueError(f"attention='triton' {problem}")
    return requested


def _triton_problem(device: torch.device) -> str | None:
    """Why the Triton paged-decode kernel cannot run here (None: it can)."""
    if importlib.util.find_spec("triton") is None:
        return "needs the triton package"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "needs a CUDA device (or TRITON_INTERPRET=1 to interpret the kernel on CPU)"
    return None


def _cpu_paged_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the C++ CPU kernel cannot run here (None: it can)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return f"needs device cpu and dtype float32/bfloat16, got {device.type} and {dtype}"
    from bucketserve.engine import cpu_ops

    if not cpu_ops.load():
        return f"needs the C++ CPU kernels, which did not build: {cpu_ops.unavailable_reason()}"
    return None


def block_size_for(backend: str, size: int | None) -> int:
    """Tokens per KV block for a resolved backend (None: its default)."""
    if backend == "triton" and size is not None and (size < 16 or size & (size - 1)):
        raise ValueError(f"block_size must be a power of two >= 16 for attention='triton', "
                         f"got {size}")  # fmt: skip
    if backend != "flash_attn":
        return size or 16
    if size is not None and size % FLASH_BLOCK_MULTIPLE:
        raise ValueError(f"block_size must be a multiple of {FLASH_BLOCK_MULTIPLE} for "
                         f"attention='flash_attn', got {size}")  # fmt: skip
    return size or FLASH_BLOCK_MULTIPLE


def make_backend(name: str) -> AttentionBackend:
    """Backend object for a resolved name (its module is imported on first use)."""
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()
