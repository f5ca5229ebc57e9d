"""torch SDPA attention over the paged KV cache (CPU, and GPUs without flash-attn)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bucketserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    DecodeGroup,
    padded_tables,
)
from bucketserve.engine.attention.sdpa_prefill import padded_prefill, plan_prefill_groups

GROUP_GROWTH = 2  # a new length group starts where a context needs > 2x the group's blocks
MIN_SAVING = 0.75  # split only when gathering drops below 75% of the padded batch's


def plan_decode_groups(context_lens: list[int], block_size: int) -> list[list[int]]:
    """Batch rows grouped by similar context length, so short sequences are not padded to
    the longest one; a single group (all rows, in order) when splitting saves little."""
    blocks = [-(-n // block_size) for n in context_lens]
    order = sorted(range(len(blocks)), key=blocks.__getitem__)
    groups, start = [], 0
    for j in range(1, len(order) + 1):
        if j == len(order) or blocks[order[j]] > GROUP_GROWTH * blocks[order[start]]:
            groups.append(order[start:j])
            start = j
    padded = len(blocks) * max(blocks)
    grouped = sum(len(g) * blocks[g[-1]] for g in groups)
    if len(groups) == 1 or grouped > MIN_SAVING * padded:
        return [list(range(len(blocks)))]
    return groups


class SdpaBackend(AttentionBackend):
    """Padded 4-D causal SDPA for prefill; gathered blocks + masked SDPA for decode."""

    name = "sdpa"

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None  # reused gather buffer (no page faults)
        self._tril: torch.Tensor | None = None  # [N, N] bool causal mask (CPU prefill)

    def prepare_prefill(self, meta: AttentionMetadata, to_tensor) -> None:
        """Fill meta.prefill_groups: the padded 4-D batches this step's prompts form."""
        meta.prefill_groups = plan_prefill_groups(meta.seq_lens, to_tensor)

    def prefill(self, q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D] packed -> [T, H, D]."""
        groups = meta.prefill_groups
        if groups is None:  # a caller that skipped prepare_prefill
            groups = plan_prefill_groups(
                meta.seq_lens, lambda d, t: torch.tensor(d, dtype=t, device=q.device)
            )
        return padded_prefill(q, k, v, groups, scale, self._causal_mask)

    def _causal_mask(self, n: int) -> torch.Tensor:
        if self._tril is None or self._tril.shape[0] < n:
            self._tril = torch.ones(n, n, dtype=torch.bool).tril()
        return self._tril

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta.decode_groups: per group, flat padded block ids and a length mask."""
        groups = plan_decode_groups(context_lens, block_size)
        meta.decode_groups = []
        for rows in groups:
            lens = [context_lens[i] for i in rows]
            num_blocks = -(-max(lens) // block_size)
            group_tables = padded_tables([tables[i] for i in rows], num_blocks)
            lens_t = to_tensor(lens, torch.int64)
            span = torch.arange(num_blocks * block_size, device=lens_t.device)
            meta.decode_groups.append(DecodeGroup(
                rows=None if len(groups) == 1 else to_tensor(rows, torch.int64),
                block_ids=to_tensor(group_tables, torch.int32).view(-1),
                attn_mask=(span < lens_t.unsqueeze(1))[:, None, None, :],
            ))  # fmt: skip

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        (first, *rest) = meta.decode_groups
        if not rest and first.rows is None:
            return self._decode_group(q, k_cache, v_cache, first, scale)
        out = torch.empty_like(q)
        for group in meta.decode_groups:
            part = self._decode_group(q.index_select(0, group.rows), k_cache, v_cache, group, scale)
            out.index_copy_(0, group.rows, part)
        return out

    def _decode_group(self, q, k_cache, v_cache, group: DecodeGroup, scale: float):
        batch, num_heads = q.shape[0], q.shape[1]
        kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k, v = self._gather(k_cache, v_cache, group.block_ids)  # [b * max_blocks, bs*KVH*D]
        k = k.view(batch, -1, kv_heads, head_dim).transpose(1, 2)  # [b, KVH, S, D]
        v = v.view(batch, -1, kv_heads, head_dim).transpose(1, 2)
        # The query heads sharing a KV head become that head's query rows: no GQA expansion.
        q = q.view(batch, kv_heads, num_heads // kv_heads, head_dim)  # [b, KVH, G, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=group.attn_mask, scale=scale)
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
