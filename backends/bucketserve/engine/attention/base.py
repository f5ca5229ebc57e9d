"""What every attention backend shares: the per-step metadata, the KV store, and one forward
over a mixed batch (decode tokens first, then prefill chunks that may attend to KV already in
the paged pool: context attention, as in vLLM's chunked prefill and Sarathi-Serve)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, built once by the runner and read by every layer.

    Rows [0, num_decode_tokens) are decode tokens (one per sequence); the rest are prefill
    chunks, chunk i holding `seq_lens[i]` query tokens that start at position
    `context_starts[i]` of its sequence (0: a fresh prompt with nothing cached).
    """

    is_prefill: bool  # no decode rows (a prefill-only step)
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot (block * block_size + offset)
    seq_lens: list[int]  # query tokens per chunk (prefill) / context length (decode-only)
    max_seqlen: int
    cu_seqlens: torch.Tensor | None = None  # [chunks + 1] int32 over the chunk rows
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, paged decode kernels
    context_lens: torch.Tensor | None = None  # [B] int32, paged decode (incl. new token)
    decode_groups: list[DecodeGroup] | None = None  # SDPA decode
    prefill_groups: list | None = None  # SDPA prefill: list[sdpa_prefill.PrefillGroup]
    num_decode_tokens: int = 0  # mixed steps: leading decode rows (0 + not is_prefill: all)
    context_starts: list[int] | None = None  # per chunk: tokens already in the pool
    chunk_block_ids: list[torch.Tensor] | None = None  # per chunk: [blocks] int64 it reads

    def decode_only(self, num_tokens: int) -> bool:
        """Every one of the step's `num_tokens` rows is a decode token (no prefill chunk)."""
        return not self.is_prefill and self.num_decode_tokens in (0, num_tokens)

    @property
    def has_context(self) -> bool:
        """Some prefill chunk attends to KV stored by an earlier step."""
        return bool(self.context_starts) and any(self.context_starts)


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


def gather_context(cache: torch.Tensor, block_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` tokens of one sequence's K or V: cache [N, bs, KVH, D] ->
    [num_tokens, KVH, D] (a copy; the chunk's own tokens were stored before this is called)."""
    return cache.index_select(0, block_ids).flatten(0, 1)[:num_tokens]


def context_chunk_attention(q, k, v, start: int, scale: float) -> torch.Tensor:
    """One chunk's causal attention over its sequence's cached prefix plus itself.

    q: [n, H, D] queries at positions start .. start+n-1; k, v: [start + n, KVH, D] -> [n, H, D].
    Query i sees keys 0 .. start+i (a causal mask shifted by the cached length)."""
    n, num_heads, head_dim = q.shape
    total, kv_heads = k.shape[0], k.shape[1]
    group = num_heads // kv_heads
    # Query heads sharing a KV head become that head's rows: [KVH, G*n, D], no K/V expansion.
    qg = q.view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, group * n, -1)
    rows = torch.arange(n, device=q.device).repeat(group) + start  # [G*n] query positions
    mask = torch.arange(total, device=q.device)[None, :] <= rows[:, None]  # [G*n, total]
    out = F.scaled_dot_product_attention(
        qg.unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, scale=scale,
    )  # fmt: skip
    return out[0].view(kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, num_heads, -1)


class AttentionBackend:
    """Base of every backend: `forward` splits a step into decode rows and prefill rows.

    A backend implements `prefill` (fresh prompts, packed k/v), `decode` (one query per
    sequence over the paged pool) and their `prepare_*` steps; `context_prefill` (chunks over
    cached KV) defaults to a gather + masked SDPA per chunk, correct for every backend, and
    backends with a paged varlen kernel override it."""

    name = "base"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        """q: [T, H, D]; k, v: [T, KVH, D] (already stored in the caches) -> [T, H, D]."""
        num_decode = 0 if meta.is_prefill else meta.num_decode_tokens
        if meta.is_prefill and not meta.has_context:
            return self.prefill(q, k, v, meta, scale)
        if meta.decode_only(q.shape[0]):
            return self.decode(q, k_cache, v_cache, meta, scale)
        out = torch.empty_like(q)
        if num_decode:
            out[:num_decode] = self.decode(q[:num_decode], k_cache, v_cache, meta, scale)
        rest = slice(num_decode, None)
        if meta.has_context:
            out[rest] = self.context_prefill(q[rest], k_cache, v_cache, meta, scale)
        else:
            out[rest] = self.prefill(q[rest], k[rest], v[rest], meta, scale)
        return out

    def context_prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        """q: [T_chunks, H, D] chunk rows -> [T_chunks, H, D], each chunk over its context."""
        out, offset = torch.empty_like(q), 0
        for n, start, ids in zip(meta.seq_lens, meta.context_starts, meta.chunk_block_ids,
                                 strict=True):  # fmt: skip
            k = gather_context(k_cache, ids, start + n)
            v = gather_context(v_cache, ids, start + n)
            out[offset : offset + n] = context_chunk_attention(q[offset : offset + n], k, v,
                                                               start, scale)  # fmt: skip
            offset += n
        return out

    def prepare_prefill(self, meta: AttentionMetadata, to_tensor) -> None:
        """Per-step prefill inputs beyond cu_seqlens (none by default)."""

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta with the padded block table and context lengths (paged kernels)."""
        fill_block_tables(meta, tables, context_lens, block_size, to_tensor)
