"""bfloat16 on CPU: the C++ kernels in bf16 against torch run the way transformers runs bf16,
the fast bf16 runner against its eager HF layout, `dtype="auto"` and the bf16 KV pool."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from bucketserve.engine import config as engine_config
from bucketserve.engine import cpu_ops
from bucketserve.engine.attention import store_kv
from bucketserve.engine.attention.cpu_paged import CpuPagedBackend
from bucketserve.engine.attention.sdpa import SdpaBackend
from bucketserve.engine.config import EngineConfig, auto_dtype, dtype_reason, resolve_dtype
from bucketserve.engine.fusion import OneDnnLinear, onednn_bf16_gemms, small_linear_rows
from bucketserve.engine.model import RMSNorm
from bucketserve.engine.rope import apply_rope
from bucketserve.engine.runner import ModelRunner

from tests.unit.engine.helpers import (
    fast_and_eager_logits,
    paged_decode,
    rel_err,
    scattered_paged_cache,
)

BF16 = torch.bfloat16
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernels():
    """The kernels must build on the test machine: a failed build fails, never skips."""
    assert cpu_ops.load(), cpu_ops.unavailable_reason()
    return torch.ops.bucketserve


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between two bf16 tensors in units of the last place (same signs)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("rows", [1, 16, 100])
def test_rms_norm_bf16_rounds_like_transformers(kernels, rows):
    norm = RMSNorm(576, 1e-5).to(BF16)
    torch.nn.init.normal_(norm.weight)
    x = (4 * torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))).to(BF16)
    ours = kernels.rms_norm(x, norm.weight.detach(), norm.eps)
    assert ours.dtype == BF16
    assert ulps(ours, norm(x).detach()) <= 1  # float32 sums in another order: at most 1 ulp


@pytest.mark.parametrize("rows", [1, 40])
def test_silu_and_mul_bf16_rounds_like_transformers(kernels, rows):
    x = (8 * torch.randn(rows, 2 * 96, generator=torch.Generator().manual_seed(rows))).to(BF16)
    gate, up = x.chunk(2, dim=-1)
    ours = kernels.silu_and_mul(x)
    assert ours.dtype == BF16 and ulps(ours, F.silu(gate) * up) <= 1


def test_rope_and_store_kv_bf16(kernels):
    tokens, heads, kv_heads, dim = 37, 6, 2, 16
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)  # strided views
    v = v.view(tokens, kv_heads, dim)
    angles = 20 * torch.rand(tokens, dim, generator=gen)
    cos, sin = angles.cos().to(BF16), angles.sin().to(BF16)
    # float32 math on the bf16 inputs, rounded once: what the kernel promises
    ref_q = apply_rope(q.float(), cos.float()[:, None], sin.float()[:, None]).to(BF16)
    ref_k = apply_rope(k.float(), cos.float()[:, None], sin.float()[:, None]).to(BF16)
    ref_kc = torch.zeros(20, 4, kv_heads, dim, dtype=BF16)
    ref_vc = torch.zeros_like(ref_kc)
    slots = torch.randperm(80, generator=gen)[:tokens]
    store_kv(ref_k, v, ref_kc, ref_vc, slots)
    k_cache, v_cache = torch.zeros_like(ref_kc), torch.zeros_like(ref_vc)
    kernels.rope_and_store_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    assert ulps(q, ref_q) <= 1 and ulps(k, ref_k) <= 1 and ulps(k_cache, ref_kc) <= 1
    assert torch.equal(v_cache, ref_vc)  # v is copied as is


@pytest.mark.parametrize(
    "lengths, heads, kv_heads, block",
    [([1], 4, 4, 4), ([5, 1, 17, 64, 3], 6, 2, 4), ([200, 7], 8, 1, 16), ([9] * 12, 9, 3, 16)],
)
def test_paged_attention_bf16_matches_float32_sdpa(kernels, lengths, heads, kv_heads, block):
    gen = torch.Generator().manual_seed(len(lengths))
    k_cache, v_cache, tables = scattered_paged_cache(lengths, block, kv_heads, 32, gen, 64)
    q = torch.randn(len(lengths), heads, 32, generator=gen)
    k_cache, v_cache, q = k_cache.to(BF16), v_cache.to(BF16), q.to(BF16)
    ours = paged_decode(CpuPagedBackend(), q, k_cache, v_cache, tables, lengths)
    # the same bf16 inputs attended in float32, rounded once
    ref = paged_decode(SdpaBackend(), q.float(), k_cache.float(), v_cache.float(), tables, lengths)
    assert ours.dtype == BF16 and ulps(ours, ref.to(BF16)) <= 2


def test_kernels_reject_mixed_dtypes(kernels):
    k_cache = torch.zeros(4, 4, 1, 8, dtype=BF16)
    with pytest.raises(RuntimeError, match="k_cache must be Float like the other inputs"):
        kernels.paged_attention_decode(torch.zeros(1, 2, 8), k_cache, k_cache,
                                       torch.tensor([[0]]), torch.tensor([1]), 1.0)  # fmt: skip
    with pytest.raises(RuntimeError, match="weight must be BFloat16 like the other inputs"):
        kernels.rms_norm(torch.zeros(2, 8, dtype=BF16), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got Half"):
        kernels.silu_and_mul(torch.zeros(2, 8, dtype=torch.float16))


@pytest.mark.parametrize("model", ["dummy:tiny", "dummy:tiny-qwen3"])
def test_bf16_runner_with_kernels_matches_its_eager_reference(model):
    """bf16 fast path (C++ kernels, fused oneDNN bf16 linears) against the bf16 HF layout."""

    # oneDNN's bf16 GEMMs need AVX512 (BW/VL/DQ); on AVX2-only CPUs the packed weights are
    # float32 copies of the bf16 ones (and small_linear reads the bf16 ones).

    def check(runner, fast):
        assert runner.pool.dtype == BF16
        assert (runner.linear_impl, runner.elementwise_impl, runner.attention_backend) == (
            ("onednn", "cpp", "cpu_paged") if fast else ("torch", "torch", "sdpa")
        )

    for ours, ref in fast_and_eager_logits(model, check, dtype="bfloat16"):
        assert ours.dtype == torch.float32  # logits (and sampling) stay float32
        assert rel_err(ours, ref) < 3e-2  # bf16 keeps ~3 significant digits per op


@pytest.mark.parametrize("rows", [5, 37])
def test_bf16_linears_above_small_linear_rows_round_a_float32_product(rows):
    """Every CPU: the oneDNN path of a bf16 OneDnnLinear is x W^T + b of the bf16 values with
    fp32 accumulation, rounded once to bf16, whether oneDNN runs bf16 GEMMs (AVX-512) or
    float32 GEMMs over float32 copies of the bf16 weights (AVX2: fusion.gemm_dtype)."""
    g = torch.Generator().manual_seed(rows)
    lin = torch.nn.Linear(576, 200, bias=True).to(BF16)
    torch.nn.init.normal_(lin.weight, std=0.05, generator=g)
    fused = OneDnnLinear(lin, small=True)
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert fused.gemm_dtype == (BF16 if native else torch.float32)
    assert fused.packed_weight.dtype == fused.gemm_dtype
    x = torch.randn(rows, 576, generator=g).to(BF16)
    got = fused(x)
    ref = x.double() @ lin.weight.double().T + lin.bias.double()
    assert got.dtype == BF16 and got.shape == (rows, 200)
    # one bf16 rounding (half an ulp: 2^-9 relative) of a float32 sum in some order
    torch.testing.assert_close(got.double(), ref, rtol=2**-8, atol=1e-4 * ref.abs().max().item())


def test_auto_picks_bf16_only_on_cpus_with_native_bf16(monkeypatch):
    monkeypatch.setattr(engine_config, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert auto_dtype(CPU) == (BF16, "the CPU has avx512_bf16")
    assert resolve_dtype("auto", CPU) == BF16
    assert dtype_reason("auto", CPU) == "auto: the CPU has avx512_bf16"
    monkeypatch.setattr(engine_config, "cpu_bf16_flags", lambda: ())  # e.g. Zen 3, Ice Lake
    hint = " (--dtype bfloat16 decodes faster here too: docs/measurements.md)"
    lacks = "the CPU lacks avx512_bf16 and amx_bf16"
    assert auto_dtype(CPU) == (torch.float32, lacks + (hint if small_linear_rows(BF16) else ""))
    assert resolve_dtype("auto", CPU) == torch.float32
    assert resolve_dtype("bfloat16", CPU) == BF16  # an explicit dtype overrides
    assert dtype_reason("float32", CPU) == "--dtype float32"
    assert resolve_dtype("auto", torch.device("cuda", 0)) == BF16


def test_auto_on_cpu_logs_its_choice(monkeypatch, caplog):
    monkeypatch.setattr(engine_config, "cpu_bf16_flags", lambda: ())
    with caplog.at_level("INFO", logger="bucketserve.engine.runner"):
        runner = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", num_blocks=8))
    try:
        assert runner.dtype == torch.float32 and runner.pool.dtype == torch.float32
        assert "dtype float32 (auto: the CPU lacks avx512_bf16" in caplog.text
        assert "cpu float32 (auto: the CPU lacks" in runner.describe()
    finally:
        runner.close()


def test_the_start_up_line_says_what_runs_the_bf16_linears():
    runner = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", dtype="bfloat16",
                                      num_blocks=8))  # fmt: skip
    try:
        rows = small_linear_rows(BF16)
        small = rf"1-{rows} rows: small_linear, its \d+ MB in one buffer" if rows else ""
        gemms = "" if onednn_bf16_gemms() else "GEMMs in float32 over the bfloat16 weights"
        detail = "; ".join(part for part in (small, gemms) if part)
        wanted = "linears onednn" + (r" \(" + detail + r"\)" if detail else "") + ", "
        assert re.search(wanted, runner.describe()), runner.describe()
    finally:
        runner.close()


def test_bf16_pool_holds_twice_the_blocks():
    blocks = {}
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", dtype=dtype,
                                          kv_cache_gb=0.01))  # fmt: skip
        blocks[dtype] = runner.num_blocks
        assert runner.pool.dtype == getattr(torch, dtype)
        runner.close()
    assert blocks["bfloat16"] // 2 == blocks["float32"]  # twice, less the odd rounding
