"""C++ CPU kernels (engine/csrc/cpu_ops.cpp) against their torch reference implementations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bucketserve.engine import cpu_ops
from bucketserve.engine.attention import store_kv
from bucketserve.engine.attention.cpu_paged import CpuPagedBackend
from bucketserve.engine.attention.sdpa import SdpaBackend
from bucketserve.engine.model import RMSNorm
from bucketserve.engine.rope import apply_rope

from tests.unit.engine.helpers import (
    fast_and_eager_logits,
    paged_decode,
    rel_err,
    scattered_paged_cache,
)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """The kernels must build on the test machine: a failed build fails, never skips."""
    assert cpu_ops.load(), cpu_ops.unavailable_reason()
    return torch.ops.bucketserve


@pytest.mark.parametrize(
    "lengths, heads, kv_heads, block",
    [
        ([1], 4, 4, 4),  # one token, no GQA, a single sequence (heads split across threads)
        ([5, 1, 17, 64, 3], 6, 2, 4),  # partial last blocks, groups of 3
        ([200, 7], 8, 1, 16),  # long context, all heads on one KV head
        ([9] * 12, 9, 3, 16),  # SmolLM2's head layout, more sequences than threads
    ],
)
def test_paged_attention_matches_sdpa(lengths, heads, kv_heads, block):
    gen = torch.Generator().manual_seed(len(lengths))
    k_cache, v_cache, tables = scattered_paged_cache(lengths, block, kv_heads, 32, gen, 64)
    q = torch.randn(len(lengths), heads, 32, generator=gen)
    ours = paged_decode(CpuPagedBackend(), q, k_cache, v_cache, tables, lengths)
    ref = paged_decode(SdpaBackend(), q, k_cache, v_cache, tables, lengths)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_of_a_sequence_does_not_depend_on_its_batch(kernels, dtype):
    """A context is cut into parts by its length alone: a 300-token sequence (5 parts) gets
    the same bits alone, in a batch of 2 (one head per work item) or of 8 (all heads)."""
    gen = torch.Generator().manual_seed(3)
    lengths = [300, 1, 65, 64, 129, 7, 250, 33]
    k_cache, v_cache, tables = scattered_paged_cache(lengths, 16, 3, 64, gen, 64)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    q = torch.randn(len(lengths), 9, 64, generator=gen).to(dtype)
    backend = CpuPagedBackend()
    alone = paged_decode(backend, q[:1], k_cache, v_cache, tables[:1], lengths[:1])
    for size in (2, 8):
        batched = paged_decode(backend, q[:size], k_cache, v_cache, tables[:size], lengths[:size])
        assert torch.equal(batched[:1], alone)
    ref = paged_decode(SdpaBackend(), q.float(), k_cache.float(), v_cache.float(), tables, lengths)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(batched.float(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("head_dim", [36, 40])
def test_paged_attention_scalar_path_for_head_dims_off_the_vector_width(head_dim):
    """head_dims the compiled widths do not fix, over several parts: 36 takes the scalar loops
    everywhere; 40 the scalar loops with AVX-512 (16 wide) and the 8-wide vector loops with
    their chunk count read at run time on AVX2."""
    gen = torch.Generator().manual_seed(5)
    lengths = [130, 3]
    k_cache, v_cache, tables = scattered_paged_cache(lengths, 8, 2, head_dim, gen, 32)
    q = torch.randn(2, 4, head_dim, generator=gen)
    ours = paged_decode(CpuPagedBackend(), q, k_cache, v_cache, tables, lengths)
    ref = paged_decode(SdpaBackend(), q, k_cache, v_cache, tables, lengths)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_paged_attention_rejects_tables_outside_the_pool(kernels):
    k_cache = torch.zeros(4, 4, 1, 8)
    q = torch.zeros(1, 2, 8)
    with pytest.raises(RuntimeError, match=r"block_tables\[0\]\[1\] = 9 is outside the pool of 4"):
        kernels.paged_attention_decode(
            q, k_cache, k_cache, torch.tensor([[0, 9]]), torch.tensor([6]), 1.0
        )
    with pytest.raises(RuntimeError, match=r"context_lens\[0\] = 9 is outside \[1, 8\]"):
        kernels.paged_attention_decode(
            q, k_cache, k_cache, torch.tensor([[0, 1]]), torch.tensor([9]), 1.0
        )
    with pytest.raises(RuntimeError, match="q must be float32"):
        kernels.paged_attention_decode(
            q.double(), k_cache, k_cache, torch.tensor([[0]]), torch.tensor([1]), 1.0
        )


@pytest.mark.parametrize("rows", [1, 16, 100])
def test_rms_norm_matches_reference(kernels, rows):
    norm = RMSNorm(576, 1e-5)
    torch.nn.init.normal_(norm.weight)
    x = 4 * torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
    ours = kernels.rms_norm(x, norm.weight.detach(), norm.eps)
    assert rel_err(ours, norm(x).detach()) < 1e-6


@pytest.mark.parametrize("rows", [1, 40])
def test_silu_and_mul_matches_reference(kernels, rows):
    x = 8 * torch.randn(rows, 2 * 96, generator=torch.Generator().manual_seed(rows))
    gate, up = x.chunk(2, dim=-1)
    assert rel_err(kernels.silu_and_mul(x), F.silu(gate) * up) < 1e-6


def test_rope_and_store_kv_matches_reference(kernels):
    tokens, heads, kv_heads, dim = 37, 6, 2, 16
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)  # strided views
    v = v.view(tokens, kv_heads, dim)
    angles = 20 * torch.rand(tokens, dim, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    slots = torch.randperm(80, generator=gen)[:tokens]
    ref_q, ref_k = (
        apply_rope(q, cos[:, None], sin[:, None]),
        apply_rope(k, cos[:, None], sin[:, None]),
    )
    ref_kc, ref_vc = torch.zeros(20, 4, kv_heads, dim), torch.zeros(20, 4, kv_heads, dim)
    store_kv(ref_k, v, ref_kc, ref_vc, slots)
    k_cache, v_cache = torch.zeros_like(ref_kc), torch.zeros_like(ref_vc)
    kernels.rope_and_store_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    torch.testing.assert_close(q, ref_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, ref_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_cache, ref_kc, rtol=1e-6, atol=1e-6)
    assert torch.equal(v_cache, ref_vc)
    with pytest.raises(RuntimeError, match=r"slot_mapping\[0\] = 80 is outside the cache's 80"):
        kernels.rope_and_store_kv(q, k, v, cos, sin, k_cache, v_cache, slots.fill_(80))


@pytest.mark.parametrize("model", ["dummy:tiny", "dummy:tiny-qwen3"])
def test_runner_with_kernels_matches_eager_reference(model):
    """The fast path (C++ kernels, fused oneDNN linears) against the plain HF-layout model."""

    def check(runner, fast):
        assert runner.elementwise_impl == ("cpp" if fast else "torch")
        # oneDNN linears run their shapes once at start-up; the HF layout has none to run
        assert ("GEMM shapes run at start-up" in runner.describe()) == fast

    config = dict(dtype="float32", warm_gemms=True, max_num_batched_tokens=1024)
    for ours, ref in fast_and_eager_logits(model, check, **config):
        assert rel_err(ours, ref) < 1e-5


TINY_OP = """
#include <ATen/core/Tensor.h>
#include <torch/library.h>
static at::Tensor same(const at::Tensor& x) { return x; }
TORCH_LIBRARY(bucketserve_lock_check, m) { m.def("same(Tensor x) -> Tensor", &same); }
"""


def test_a_build_goes_past_a_stale_lock(tmp_path):
    """A build killed mid-way leaves torch's lock file; the next build must not wait forever.
    The same build() the kernels go through, over a one-op library (seconds, not a minute)."""
    import os
    import subprocess
    import sys

    (tmp_path / "same.cpp").write_text(TINY_OP)
    lock = tmp_path / "build" / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = lock.stat().st_mtime - 2 * cpu_ops.STALE_LOCK_S
    os.utime(lock, (old, old))
    code = (
        "import sys, torch; from pathlib import Path; from bucketserve.engine import cpu_ops; "
        "d = Path(sys.argv[1]); cpu_ops.build('bucketserve_lock_check', [d / 'same.cpp'], d / 'build'); "
        "print(torch.ops.bucketserve_lock_check.same(torch.ones(2)).tolist())"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.stdout.strip() == "[1.0, 1.0]", proc.stdout + proc.stderr[-2000:]
    assert (lock.parent / "bucketserve_lock_check.so").exists() and not lock.exists()


def test_a_recent_lock_is_left_alone(tmp_path, monkeypatch):
    """A lock younger than STALE_LOCK_S may belong to a build still running: not removed (the
    build waits on it; torch's loader is stopped here before it would)."""
    from torch.utils import cpp_extension

    class Stop(Exception):
        pass

    def stop(**kwargs):
        raise Stop

    monkeypatch.setattr(cpp_extension, "load", stop)
    lock = tmp_path / "lock"
    lock.touch()
    with pytest.raises(Stop):
        cpu_ops.build("x", [], tmp_path)
    assert lock.exists()


def test_gemm_rows_bound_the_shapes_and_the_padding():
    """oneDNN GEMM row counts: never fewer than asked, exact below 32, at most 1/16 more from
    32 rows, chunks of CHUNK_ROWS above that, monotonic within a chunk, and few distinct
    values (each costs memory for good), all of them in gemm_shapes."""
    from bucketserve.engine.fusion import CHUNK_ROWS, MIN_ROWS, gemm_rows, gemm_shapes

    shapes = set(gemm_shapes(8192))
    for rows in range(1, 8193):
        gemms = gemm_rows(rows)
        assert set(gemms) <= shapes
        assert sum(gemms) >= rows and all(g <= CHUNK_ROWS for g in gemms)
        assert gemms[:-1] == [CHUNK_ROWS] * (len(gemms) - 1)
        rest = rows % CHUNK_ROWS or CHUNK_ROWS
        if MIN_ROWS <= rest < 32:
            assert gemms[-1] == rest
        elif rest >= 32:
            assert gemms[-1] <= rest * (1 + 1 / 16)
    within_a_chunk = [gemm_rows(r)[0] for r in range(1, CHUNK_ROWS + 1)]
    assert within_a_chunk == sorted(within_a_chunk)
    assert len(shapes) <= 28 + 16 * 4 + 1  # exact below 32, 16 per power of two up to 512
    assert gemm_shapes(20) == list(range(MIN_ROWS, 21))


def test_warm_onednn_runs_each_shape_once_and_bounds_the_logit_rows():
    from bucketserve.engine.fusion import OneDnnLinear, gemm_shapes, warm_onednn

    model = torch.nn.Module()
    model.a, model.b = OneDnnLinear(torch.nn.Linear(64, 96)), OneDnnLinear(torch.nn.Linear(64, 96))
    model.lm_head = OneDnnLinear(torch.nn.Linear(64, 1000, bias=False))
    calls = []
    for m in (model.a, model.b, model.lm_head):
        m._gemm = lambda x, m=m, f=m._gemm: calls.append((m, x.shape[0])) or f(x)
    assert warm_onednn(model, 700, 40) == len(gemm_shapes(700)) + len(gemm_shapes(40))
    assert [r for m, r in calls if m is model.a] == gemm_shapes(700)
    assert not [r for m, r in calls if m is model.b]  # same shape as `a`: its primitives
    assert [r for m, r in calls if m is model.lm_head] == gemm_shapes(40)


def test_onednn_linear_matches_torch_at_padded_and_chunked_row_counts():
    from bucketserve.engine.fusion import CHUNK_ROWS, OneDnnLinear, gemm_rows, is_onednn_available

    assert is_onednn_available()  # this torch build has it: the fast path must be tested
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).eval()
    packed = OneDnnLinear(linear)
    sizes = (1, 3, 33, 129, 300, 901, 2 * CHUNK_ROWS + 37)
    assert all(sum(gemm_rows(rows)) > rows for rows in sizes)  # each one runs padded
    assert len(gemm_rows(sizes[-1])) == 3  # and the last in chunks
    for rows in sizes:
        x = torch.randn(rows, 64)
        with torch.inference_mode():
            out = packed(x)
        assert out.shape == (rows, 96)
        assert rel_err(out, F.linear(x, linear.weight, linear.bias)) < 1e-5
