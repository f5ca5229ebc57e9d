"""flash-attn (GPU, only where already importable): varlen prefill on the packed batch, paged
decode and chunks over cached context through `block_table`."""

from __future__ import annotations

import torch

from bucketserve.engine.attention.base import AttentionBackend, AttentionMetadata


class FlashAttnBackend(AttentionBackend):
    """flash-attn: varlen prefill on the packed batch, paged decode through block_table."""

    name = "flash_attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def prefill(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] packed -> [T, H, D]."""
        return self._varlen(
            q, k, v, cu_seqlens_q=meta.cu_seqlens, cu_seqlens_k=meta.cu_seqlens,
            max_seqlen_q=meta.max_seqlen, max_seqlen_k=meta.max_seqlen,
            softmax_scale=scale, causal=True,
        )  # fmt: skip

    def context_prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        """Chunks over their cached context: varlen queries, keys read through block_table
        (flash-attn >= 2.5); causal is bottom-right aligned, i.e. shifted by the cached part."""
        kv_lens = [s + n for s, n in zip(meta.context_starts, meta.seq_lens, strict=True)]
        cu_k = torch.zeros(len(kv_lens) + 1, dtype=torch.int32, device=q.device)
        cu_k[1:] = torch.tensor(kv_lens, device=q.device).cumsum(0)
        width = max(ids.numel() for ids in meta.chunk_block_ids)
        table = torch.zeros(len(kv_lens), width, dtype=torch.int32, device=q.device)
        for row, ids in enumerate(meta.chunk_block_ids):
            table[row, : ids.numel()] = ids
        return self._varlen(
            q, k_cache, v_cache, cu_seqlens_q=meta.cu_seqlens, cu_seqlens_k=cu_k,
            max_seqlen_q=meta.max_seqlen, max_seqlen_k=max(kv_lens), softmax_scale=scale,
            causal=True, block_table=table,
        )  # fmt: skip

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        out = self._with_kvcache(
            q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.context_lens,
            block_table=meta.block_tables, softmax_scale=scale, causal=True,
        )  # fmt: skip  # [B, 1, H, D]
        return out.squeeze(1)
