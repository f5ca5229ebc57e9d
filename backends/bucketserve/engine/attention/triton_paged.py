"""Triton paged-decode attention (GPUs without flash-attn): reads K/V straight from the pool
through the block tables with an online softmax. Split-K: each (sequence, KV head) walks its
context in NUM_SPLITS slices in parallel (8 KV heads at batch 1 would fill 8 of 132 SMs), and a
second kernel merges the slices. Graph-safe: no host sync, shapes fixed by the block-table width.
Prefill stays on SDPA. Runs on CPU under TRITON_INTERPRET=1 (how the tests check it).
flash-attn cannot be installed here: docs/platform-notes.md#p15-flash-attn-not-installable"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bucketserve.engine.attention.base import AttentionMetadata, fill_block_tables
from bucketserve.engine.attention.sdpa import SdpaBackend
from bucketserve.engine.device import device_context

MAX_SPLITS = 16
TARGET_PROGRAMS = 264  # ~2 waves of an H100/H200's 132 SMs


# stride_tb is the block-table width: not specialised, so a growing table never recompiles.
@triton.jit(do_not_specialize=["stride_tb"])
def _paged_decode_split_kernel(
    q_ptr, k_ptr, v_ptr, part_acc_ptr, part_ml_ptr, tables_ptr, lens_ptr, scale,
    stride_qb, stride_qh, stride_cb, stride_ct, stride_ch, stride_tb,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_G)  # query heads sharing this KV head (padded to >= 16 for tl.dot)
    dims = tl.arange(0, BLOCK_D)
    tokens = tl.arange(0, BLOCK_SIZE)
    row_ok, dim_ok = rows < GROUP, dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip
    length = tl.load(lens_ptr + seq)
    # Each sequence splits its own context (read on the device): balanced at any length,
    # and nothing host-side depends on the lengths (graph-safe).
    num_blocks = tl.cdiv(length, BLOCK_SIZE)
    per_split = tl.cdiv(num_blocks, NUM_SPLITS)
    first = split * per_split
    last = tl.minimum(first + per_split, num_blocks)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for i in range(first, last):
        block = tl.load(tables_ptr + seq * stride_tb + i).to(tl.int64)
        offs = block * stride_cb + tokens[:, None] * stride_ct + kv_head * stride_ch + dims[None, :]
        tok_ok = i * BLOCK_SIZE + tokens < length
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)  # [BLOCK_SIZE, BLOCK_D]
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
        if IEEE:  # float32 pools: tl.dot would otherwise round through TF32 (~1e-3)
            s = tl.dot(q, tl.trans(k), out_dtype=tl.float32, input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), out_dtype=tl.float32)
        s = tl.where(tok_ok[None, :], s * scale, float("-inf"))  # [BLOCK_G, BLOCK_SIZE]
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, out_dtype=tl.float32, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
        acc = acc * alpha[:, None] + pv
        m = m_new
    # Partial results [B, KVH, NUM_SPLITS, BLOCK_G, (BLOCK_D | 2)]; an empty slice leaves
    # m = -inf, denom = 0, acc = 0, which the merge weighs with exp(-inf) = 0.
    part = (seq * tl.num_programs(1) + kv_head) * NUM_SPLITS + split
    tl.store(part_acc_ptr + part * BLOCK_G * BLOCK_D + rows[:, None] * BLOCK_D + dims[None, :], acc)
    tl.store(part_ml_ptr + part * BLOCK_G * 2 + rows * 2, m)
    tl.store(part_ml_ptr + part * BLOCK_G * 2 + rows * 2 + 1, denom)


@triton.jit
def _merge_splits_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):  # fmt: skip
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    rows, dims = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
    base = (seq * tl.num_programs(1) + kv_head) * NUM_SPLITS
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for s in range(NUM_SPLITS):
        part = base + s
        m_s = tl.load(part_ml_ptr + part * BLOCK_G * 2 + rows * 2)
        d_s = tl.load(part_ml_ptr + part * BLOCK_G * 2 + rows * 2 + 1)
        a_s = tl.load(part_acc_ptr + part * BLOCK_G * BLOCK_D + rows[:, None] * BLOCK_D
                      + dims[None, :])  # fmt: skip
        m_new = tl.maximum(m, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no (-inf) - (-inf) = NaN
        alpha, beta = tl.exp(m - m_safe), tl.exp(m_s - m_safe)
        denom = denom * alpha + d_s * beta
        acc = acc * alpha[:, None] + a_s * beta[:, None]
        m = m_new
    out = acc / denom[:, None]
    heads = kv_head * GROUP + rows
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty),
             mask=(rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :])  # fmt: skip


def num_splits(batch: int, kv_heads: int, max_blocks: int) -> int:
    """Context slices per (sequence, KV head): enough programs to fill the GPU, a function of
    static shapes only (so a captured graph stays valid)."""
    want = -(-TARGET_PROGRAMS // (batch * kv_heads))
    return max(1, min(MAX_SPLITS, want, max_blocks))


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
    block_g, block_d = (
        max(16, triton.next_power_of_2(group)),
        max(16, triton.next_power_of_2(head_dim)),
    )
    splits = num_splits(batch, kv_heads, block_tables.shape[1])
    part_acc = torch.empty(batch, kv_heads, splits, block_g, block_d, dtype=torch.float32,
                           device=q.device)  # fmt: skip
    part_ml = torch.empty(batch, kv_heads, splits, block_g, 2, dtype=torch.float32, device=q.device)
    # Triton launches on the thread's *current* CUDA device, not the tensors' (issue 11 item 5).
    with device_context(q.device):
        _paged_decode_split_kernel[(batch, kv_heads, splits)](
            q, k_cache, v_cache, part_acc, part_ml, block_tables, context_lens, scale,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            block_tables.stride(0),
            GROUP=group, BLOCK_G=block_g, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
            BLOCK_D=block_d, NUM_SPLITS=splits, IEEE=q.dtype == torch.float32,
        )  # fmt: skip
        _merge_splits_kernel[(batch, kv_heads)](
            part_acc, part_ml, out, out.stride(0), out.stride(1),
            GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=splits,
        )  # fmt: skip
    return out


class TritonBackend(SdpaBackend):
    """SDPA prefill; decode through the Triton paged kernel."""

    name = "triton"
    is_graph_safe = True

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta with the padded block table and context lengths."""
        fill_block_tables(meta, tables, context_lens, block_size, to_tensor)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        return paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
