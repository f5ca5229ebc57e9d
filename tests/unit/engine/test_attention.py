"""Attention backends: paged SDPA decode against a dense reference; backend selection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bucketserve.engine import cpu_ops
from bucketserve.engine.attention import AttentionMetadata, resolve_backend_name, store_kv
from bucketserve.engine.attention.sdpa import SdpaBackend, plan_decode_groups

from tests.unit.engine.helpers import paged_decode, scattered_paged_cache

NUM_BLOCKS, BLOCK, KVH, H, D = 40, 4, 2, 6, 8


def _dense_reference(q, k_cache, v_cache, table, length, scale):
    k = k_cache[table].reshape(-1, KVH, D)[:length].transpose(0, 1)  # [KVH, S, D]
    v = v_cache[table].reshape(-1, KVH, D)[:length].transpose(0, 1)
    k, v = k.repeat_interleave(H // KVH, 0), v.repeat_interleave(H // KVH, 0)
    probs = torch.softmax((q.unsqueeze(1) @ k.transpose(1, 2)) * scale, dim=-1)  # [H, 1, S]
    return (probs @ v).squeeze(1)  # [H, D]


@pytest.mark.parametrize("lengths", [[1, 4, 5, 13], [2, 30, 3, 29, 1, 31], [9] * 5])
def test_paged_decode_matches_dense_with_scattered_blocks(lengths):
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache, tables = scattered_paged_cache(lengths, BLOCK, KVH, D, gen, NUM_BLOCKS)
    q = torch.randn(len(lengths), H, D, generator=gen)
    out = paged_decode(SdpaBackend(), q, k_cache, v_cache, tables, lengths)
    for i, n in enumerate(lengths):
        ref = _dense_reference(q[i], k_cache, v_cache, tables[i], n, D**-0.5)
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-5)


def test_decode_groups_split_only_when_it_pays():
    assert plan_decode_groups([9] * 5, 4) == [[0, 1, 2, 3, 4]]
    assert plan_decode_groups([5, 6, 7], 4) == [[0, 1, 2]]
    groups = plan_decode_groups([2, 300, 3, 290, 1, 310], 4)
    assert sorted(map(sorted, groups)) == [[0, 2, 4], [1, 3, 5]]
    assert plan_decode_groups([100, 100, 100, 100, 20], 4) == [[0, 1, 2, 3, 4]]  # saves < 25%


@pytest.mark.parametrize("lens", [[3, 1, 6], [300, 2, 129], [5, 5], [7, 40, 33, 41, 1, 60]])
def test_packed_prefill_is_causal_per_sequence(lens):
    gen = torch.Generator().manual_seed(1)
    total = sum(lens)
    q, k, v = (torch.randn(total, n, D, generator=gen) for n in (H, KVH, KVH))
    meta = AttentionMetadata(is_prefill=True, slot_mapping=torch.arange(total), seq_lens=lens,
                             max_seqlen=max(lens))  # fmt: skip
    out = SdpaBackend().prefill(q, k, v, meta, scale=0.3)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        ref = F.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1).repeat_interleave(3, 0),
            v[sl].transpose(0, 1).repeat_interleave(3, 0), is_causal=True, scale=0.3,
        ).transpose(0, 1)  # fmt: skip
        torch.testing.assert_close(out[sl], ref, rtol=1e-5, atol=1e-5)
        start += n


def test_prefill_is_one_4d_sdpa_call_per_length_group(monkeypatch):
    """Fused SDPA kernels need 4-D input; 3-D runs the O(n^2)-memory math kernel. A batch of
    similar lengths is one padded call, not one call per sequence."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.dim(), k.dim(), q.shape[0]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    lens = [40, 37, 33, 45, 30, 41, 39, 44]
    total = sum(lens)
    q, k, v = (torch.randn(total, n, D) for n in (H, KVH, KVH))
    meta = AttentionMetadata(is_prefill=True, slot_mapping=torch.arange(total), seq_lens=lens,
                             max_seqlen=max(lens))  # fmt: skip
    SdpaBackend().prefill(q, k, v, meta, scale=0.3)
    assert calls == [(4, 4, len(lens))]


def test_store_kv_writes_flat_slots():
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KVH, D)
    v_cache = torch.zeros_like(k_cache)
    k, v = torch.ones(2, KVH, D), 2 * torch.ones(2, KVH, D)
    store_kv(k, v, k_cache, v_cache, torch.tensor([5, 3 * BLOCK + 1]))
    assert k_cache[1, 1].eq(1).all() and v_cache[3, 1].eq(2).all()
    assert k_cache.sum() == 2 * KVH * D


def test_backend_selection_on_cpu(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_backend_name("auto", cpu, torch.float32) == "cpu_paged"
    assert resolve_backend_name("cpu_paged", cpu, torch.float32) == "cpu_paged"
    assert resolve_backend_name("auto", cpu, torch.bfloat16) == "cpu_paged"
    assert resolve_backend_name("auto", cpu, torch.float16) == "sdpa"
    assert resolve_backend_name("sdpa", cpu) == "sdpa"
    with pytest.raises(ValueError, match="needs device cpu and dtype float32/bfloat16"):
        resolve_backend_name("cpu_paged", cpu, torch.float16)
    monkeypatch.setattr(cpu_ops, "load", lambda: False)  # a machine without a C++ compiler
    assert resolve_backend_name("auto", cpu, torch.float32) == "sdpa"
    with pytest.raises(ValueError, match="C\\+\\+ CPU kernels, which did not build"):
        resolve_backend_name("cpu_paged", cpu, torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_backend_name("flash_attn", cpu)
    with pytest.raises(ValueError, match="attention must be one of"):
        resolve_backend_name("xformers", cpu)
