"""Attention backends over the paged KV cache: flash-attn (GPU), the Triton paged-decode kernel
(GPU, opt-in), the C++ paged kernel (CPU, float32) and torch SDPA (anywhere)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

ATTENTION_BACKENDS = ("auto", "flash_attn", "cpu_paged", "sdpa", "triton")
FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged KV wants page sizes divisible by 256
FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, built once by the runner and read by every layer."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot (block * block_size + offset)
    seq_lens: list[int]  # query tokens per sequence (prefill) / context length (decode)
    max_seqlen: int
    cu_seqlens: torch.Tensor | None = None  # [B + 1] int32, prefill only
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, paged decode kernels
    context_lens: torch.Tensor | None = None  # [B] int32, paged decode (incl. new token)
    decode_groups: list[DecodeGroup] | None = None  # SDPA decode
    prefill_groups: list | None = None  # SDPA prefill: list[sdpa_prefill.PrefillGroup]


@dataclass(slots=True)
class DecodeGroup:
    """Rows of a decode batch whose KV is gathered and attended together (SDPA)."""

    rows: torch.Tensor | None  # [b] int64 batch rows; None: the whole batch in order
    block_ids: torch.Tensor  # [b * max_blocks] int32: padded block tables, flattened
    attn_mask: torch.Tensor  # [b, 1, 1, max_blocks * block_size] bool: True = attend


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v [T, KVH, D] into caches [num_blocks, block_size, KVH, D] at flat slots."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def padded_tables(tables: list[list[int]], num_blocks: int) -> list[list[int]]:
    """Block tables cut or padded (with block 0, masked out) to `num_blocks` entries."""
    return [t[:num_blocks] + [0] * (num_blocks - len(t)) for t in tables]


def fill_block_tables(meta, tables, context_lens, block_size, to_tensor) -> None:
    """meta.block_tables [B, max_blocks] int32 (padded) and meta.context_lens [B] int32: the
    inputs of every paged decode kernel (flash-attn, Triton, C++)."""
    num_blocks = -(-max(context_lens) // block_size)
    meta.block_tables = to_tensor(padded_tables(tables, num_blocks), torch.int32)
    meta.context_lens = to_tensor(context_lens, torch.int32)


class FlashAttnBackend:
    """flash-attn: varlen prefill on the packed batch, paged decode through block_table."""

    name = "flash_attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def prefill(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] packed -> [T, H, D]."""
        return self._varlen(
            q,
            k,
            v,
            cu_seqlens_q=meta.cu_seqlens,
            cu_seqlens_k=meta.cu_seqlens,
            max_seqlen_q=meta.max_seqlen,
            max_seqlen_k=meta.max_seqlen,
            softmax_scale=scale,
            causal=True,
        )

    def prepare_prefill(self, meta, to_tensor) -> None:
        """Nothing beyond cu_seqlens (varlen)."""

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta with the padded block table and context lengths."""
        fill_block_tables(meta, tables, context_lens, block_size, to_tensor)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        out = self._with_kvcache(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=meta.context_lens,
            block_table=meta.block_tables,
            softmax_scale=scale,
            causal=True,
        )  # [B, 1, H, D]
        return out.squeeze(1)


def is_flash_attn_available() -> bool:
    """flash-attn importable (it only runs on CUDA)."""
    return importlib.util.find_spec("flash_attn") is not None


def resolve_backend_name(
    requested: str, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> str:
    """The backend `requested` ("auto" or a name) resolves to on `device` for `dtype`."""
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


def make_backend(name: str):
    """Backend object for a resolved name."""
    if name == "flash_attn":
        return FlashAttnBackend()
    if name == "cpu_paged":
        from bucketserve.engine.cpu_attention import CpuPagedBackend

        return CpuPagedBackend()
    if name == "triton":
        from bucketserve.engine.triton_attention import TritonBackend

        return TritonBackend()
    from bucketserve.engine.sdpa_attention import SdpaBackend

    return SdpaBackend()
