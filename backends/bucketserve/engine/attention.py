"""Attention backends over the paged KV cache: flash-attn (GPU) and torch SDPA (anywhere)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTENTION_BACKENDS = ("auto", "flash_attn", "sdpa", "triton")
FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged KV wants page sizes divisible by 256


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, built once by the runner and read by every layer."""

    is_prefill: bool
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot (block * block_size + offset)
    seq_lens: list[int]  # query tokens per sequence (prefill) / context length (decode)
    max_seqlen: int
    cu_seqlens: torch.Tensor | None = None  # [B + 1] int32, prefill only
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, decode only
    context_lens: torch.Tensor | None = None  # [B] int32, decode only (incl. new token)
    attn_mask: torch.Tensor | None = None  # [B, 1, 1, S] bool, SDPA decode only


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


class SdpaBackend:
    """torch SDPA: causal attention per sequence for prefill; gathered blocks for decode."""

    name = "sdpa"
    needs_decode_mask = True

    def prefill(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] packed -> [T, H, D]."""
        outs, start = [], 0
        for n in meta.seq_lens:
            qi = q[start : start + n].transpose(0, 1)  # [H, n, D]
            ki = k[start : start + n].transpose(0, 1)  # [KVH, n, D]
            vi = v[start : start + n].transpose(0, 1)
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True
            )
            outs.append(oi.transpose(0, 1))
            start += n
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None  # reused gather buffer (no page faults)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        batch, num_heads = q.shape[0], q.shape[1]
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        block_ids = meta.block_tables.view(-1)  # [B * max_blocks]
        k, v = self._gather(k_cache, v_cache, block_ids)  # [B * max_blocks, bs * KVH * D]
        k = k.view(batch, -1, kv_heads, head_dim).transpose(1, 2)  # [B, KVH, S, D]
        v = v.view(batch, -1, kv_heads, head_dim).transpose(1, 2)
        # The query heads sharing a KV head become that head's query rows: no GQA expansion.
        q = q.view(batch, kv_heads, num_heads // kv_heads, head_dim)  # [B, KVH, G, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.attn_mask, scale=scale)
        return out.reshape(batch, num_heads, head_dim)

    def _gather(self, k_cache, v_cache, block_ids):
        num_blocks, per_block = k_cache.shape[0], k_cache[0].numel()
        numel = 2 * block_ids.numel() * per_block
        ws = self._workspace
        if (
            ws is None
            or ws.numel() < numel
            or ws.dtype != k_cache.dtype
            or ws.device != k_cache.device
        ):
            ws = self._workspace = torch.empty(numel, dtype=k_cache.dtype, device=k_cache.device)
        buf = ws[:numel].view(2, block_ids.numel(), per_block)
        torch.index_select(k_cache.view(num_blocks, per_block), 0, block_ids, out=buf[0])
        torch.index_select(v_cache.view(num_blocks, per_block), 0, block_ids, out=buf[1])
        return buf[0], buf[1]


class FlashAttnBackend:
    """flash-attn: varlen prefill on the packed batch, paged decode through block_table."""

    name = "flash_attn"
    needs_decode_mask = False

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


def is_triton_available() -> bool:
    """Triton importable (GPU, or CPU with TRITON_INTERPRET=1)."""
    return importlib.util.find_spec("triton") is not None


def resolve_backend_name(requested: str, device: torch.device) -> str:
    """The backend `requested` ("auto" or a name) resolves to on `device`."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    is_cuda = device.type == "cuda"
    if requested == "auto":
        return "flash_attn" if is_cuda and is_flash_attn_available() else "sdpa"
    if requested == "flash_attn" and not (is_cuda and is_flash_attn_available()):
        raise ValueError("attention='flash_attn' needs a CUDA device and the flash_attn package")
    if requested == "triton" and not is_triton_available():
        raise ValueError("attention='triton' needs the triton package")
    return requested


def make_backend(name: str):
    """Backend object for a resolved name."""
    if name == "flash_attn":
        return FlashAttnBackend()
    if name == "triton":
        from bucketserve.engine.triton_decode import TritonBackend

        return TritonBackend()
    return SdpaBackend()
