"""Triton paged-decode attention (GPUs without flash-attn): reads K/V straight from the pool
through the block tables with an online softmax, one program per (sequence, KV head).
Prefill stays on SDPA. Runs on CPU under TRITON_INTERPRET=1 (how the tests check it)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bucketserve.engine.attention import AttentionMetadata, fill_block_tables
from bucketserve.engine.sdpa_attention import SdpaBackend


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, lens_ptr, scale,
    stride_qb, stride_qh, stride_cb, stride_ct, stride_ch, stride_tb,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)  # query heads sharing this KV head (padded to >= 16 for tl.dot)
    dims = tl.arange(0, BLOCK_D)
    tokens = tl.arange(0, BLOCK_SIZE)
    row_ok, dim_ok = rows < GROUP, dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip
    length = tl.load(lens_ptr + seq)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK_SIZE)):
        block = tl.load(tables_ptr + seq * stride_tb + i).to(tl.int64)
        offs = block * stride_cb + tokens[:, None] * stride_ct + kv_head * stride_ch + dims[None, :]
        tok_ok = i * BLOCK_SIZE + tokens < length
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)  # [BLOCK_SIZE, BLOCK_D]
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), out_dtype=tl.float32) * scale  # [BLOCK_G, BLOCK_SIZE]
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
        m = m_new
    out = acc / denom[:, None]
    tl.store(out_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])  # fmt: skip


def paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    """q: [B, H, D]; caches [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
    int32; context_lens [B] int32 -> [B, H, D]."""
    batch, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if block_size & (block_size - 1) or block_size < 16:  # tl.arange and tl.dot need it
        raise ValueError(f"block_size must be a power of two >= 16 for attention='triton', "
                         f"got {block_size}")  # fmt: skip
    q = q.contiguous()
    out = torch.empty_like(q)
    group = num_heads // kv_heads
    _paged_decode_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )  # fmt: skip
    return out


class TritonBackend(SdpaBackend):
    """SDPA prefill; decode through the Triton paged kernel."""

    name = "triton"

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta with the padded block table and context lengths."""
        fill_block_tables(meta, tables, context_lens, block_size, to_tensor)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        return paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
