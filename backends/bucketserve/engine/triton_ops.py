"""Fused element-wise kernels for GPU decode (Triton): RMSNorm, rotary embedding + KV store,
SiLU-and-mul. Eager torch spends 8, 2 x 5 + 2 and 2 launches on these per layer; each is one
launch here. Numerics follow the torch reference (float32 math, rounding where HF rounds).
Runs on CPU under TRITON_INTERPRET=1 (how the tests check them)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bucketserve.engine.device import device_context


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < dim
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    # HF: weight * normed.to(input dtype): round to the input dtype, then scale
    y = w.to(tl.float32) * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, D] -> [T, D]."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(x.shape, dtype=torch.result_type(x, weight), device=x.device)
    with device_context(x.device):
        _rms_norm_kernel[(x.shape[0],)](x, weight, out, x.stride(0), out.stride(0), x.shape[1],
                                        eps, BLOCK=triton.next_power_of_2(x.shape[1]))  # fmt: skip
    return out


@triton.jit
def _rotate(ptr, c1, c2, s1, s2, half_cols, HALF: tl.constexpr):
    """In place: x * cos + rotate_half(x) * sin for one head row at ptr (float32 math)."""
    ok = half_cols < HALF
    x1 = tl.load(ptr + half_cols, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF + half_cols, mask=ok, other=0.0).to(tl.float32)
    out1 = x1 * c1 - x2 * s1
    out2 = x2 * c2 + x1 * s2
    tl.store(ptr + half_cols, out1.to(ptr.dtype.element_ty), mask=ok)
    tl.store(ptr + HALF + half_cols, out2.to(ptr.dtype.element_ty), mask=ok)
    return out1, out2


@triton.jit
def _rope_store_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_cs,
    stride_slot, stride_ch, NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    t, head = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK_H)
    ok = cols < HALF
    c1 = tl.load(cos_ptr + t * stride_ct + cols, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + cols, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_cs + cols, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_cs + HALF + cols, mask=ok, other=0.0).to(tl.float32)
    if head < NUM_HEADS:
        _rotate(q_ptr + t * stride_qt + head * stride_qh, c1, c2, s1, s2, cols, HALF)
    else:
        kv_head = head - NUM_HEADS
        k_row = k_ptr + t * stride_kt + kv_head * stride_kh
        k1, k2 = _rotate(k_row, c1, c2, s1, s2, cols, HALF)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        dst = slot * stride_slot + kv_head * stride_ch
        tl.store(kc_ptr + dst + cols, k1.to(kc_ptr.dtype.element_ty), mask=ok)
        tl.store(kc_ptr + dst + HALF + cols, k2.to(kc_ptr.dtype.element_ty), mask=ok)
        v_row = v_ptr + t * stride_vt + kv_head * stride_vh
        v1 = tl.load(v_row + cols, mask=ok, other=0.0)
        v2 = tl.load(v_row + HALF + cols, mask=ok, other=0.0)
        tl.store(vc_ptr + dst + cols, v1, mask=ok)
        tl.store(vc_ptr + dst + HALF + cols, v2, mask=ok)


def rope_and_store(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    """In place: rotate q [T, H, D] and k [T, KVH, D] (cos, sin [T, D]); write k, v into the
    caches [num_blocks, block_size, KVH, D] at the flat slots [T]."""
    num_tokens, num_heads, head_dim = q.shape
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or head_dim % 2:
        raise ValueError("rope_and_store needs unit-stride heads of even head_dim")
    kv_heads = k.shape[1]
    with device_context(q.device):
        _rope_store_kernel[(num_tokens, num_heads + kv_heads)](
            q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0), k_cache.stride(1), k_cache.stride(2),
            NUM_HEADS=num_heads, HALF=head_dim // 2,
            BLOCK_H=triton.next_power_of_2(head_dim // 2),
        )  # fmt: skip


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, width, BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + width + cols, mask=ok, other=0.0).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)  # F.silu rounds
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2F] -> silu(gate) * up [T, F]."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(width))
    with device_context(gate_up.device):
        _silu_mul_kernel[(rows, triton.cdiv(width, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), width, BLOCK=block
        )
    return out
