"""torch.ops.bucketserve.small_linear (csrc/small_linear.cpp), the linears of decode steps of
1-4 rows: bf16 on CPUs with AVX512-BF16, float32 on AVX2 CPUs without AVX-512. Each dtype's
tests run where the CPU has its kernel and skip, saying so, elsewhere; which dtypes a CPU runs
is itself checked against its flags."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine import cpu_ops
from bucketserve.engine.fusion import OneDnnLinear, small_linear_available

BF16 = torch.bfloat16
F32 = torch.float32
K_STEP = {BF16: 32, F32: 16}


def cpu_flags() -> set[str]:
    text = open("/proc/cpuinfo").read()
    return set(next(line for line in text.splitlines() if line.startswith("flags")).split()[2:])


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """The kernels must build on the test machine: a failed build fails, never skips."""
    assert cpu_ops.load(), cpu_ops.unavailable_reason()


def test_each_dtype_runs_where_its_instructions_are():
    flags = cpu_flags()
    assert small_linear_available(BF16) == ("avx512_bf16" in flags)
    assert small_linear_available(F32) == ({"avx2", "fma"} <= flags and "avx512f" not in flags)
    assert not small_linear_available(torch.float16)


@pytest.fixture(params=[BF16, F32], ids=["bfloat16", "float32"])
def dtype(request):
    if not small_linear_available(request.param):
        pytest.skip(f"small_linear has no {request.param} kernel on this CPU; the bf16 tests run "
                    "on CPUs with AVX512-BF16 (Zen 4, Cooper Lake and later), the float32 ones "
                    "on AVX2 + FMA CPUs without AVX-512 (most laptops)")  # fmt: skip
    return request.param


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize(("k", "bias"), [(576, False), (96, True), (1536, False)])
def test_small_linear_matches_a_float32_matmul(dtype, rows, k, bias):
    """x W^T (+ b) with fp32 accumulation, rounded once: within the dtype's rounding of the
    float32 product of the same inputs (odd and even block counts, with a bias)."""
    g = torch.Generator().manual_seed(rows * k)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (0.05 * torch.randn(200, k, generator=g)).to(dtype)
    b = torch.randn(200, generator=g).to(dtype) if bias else None
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    got = torch.ops.bucketserve.small_linear(x, w, b)
    assert got.dtype == dtype and got.shape == (rows, 200)
    tol = 8e-3 if dtype == BF16 else 1e-5
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_small_linear_rejects_what_it_does_not_run(dtype):
    small = torch.ops.bucketserve.small_linear
    step = K_STEP[dtype]
    w = torch.zeros(8, 64, dtype=dtype)
    with pytest.raises(RuntimeError, match="x must have 1 to 4 rows, got 5"):
        small(torch.zeros(5, 64, dtype=dtype), w, None)
    odd = step + step // 2
    with pytest.raises(RuntimeError, match=f"K a multiple of {step}"):
        small(torch.zeros(1, odd, dtype=dtype), torch.zeros(8, odd, dtype=dtype), None)
    with pytest.raises(RuntimeError, match="x and weight of one dtype"):
        small(
            torch.zeros(1, 64, dtype=torch.float16), torch.zeros(8, 64, dtype=torch.float16), None
        )
    with pytest.raises(RuntimeError, match="x and weight of one dtype"):
        small(torch.zeros(1, 64, dtype=dtype), torch.zeros(8, 64, dtype=torch.float64), None)


def test_linears_run_small_linear_up_to_4_rows_and_onednn_above(dtype):
    small = torch.ops.bucketserve.small_linear
    lin = torch.nn.Linear(576, 320, bias=True).to(dtype)
    fused = OneDnnLinear(lin, small=True)
    assert fused.plain_weight is not None
    ref = torch.nn.Linear(576, 320, bias=True).to(dtype)
    ref.load_state_dict(lin.state_dict())
    plain = OneDnnLinear(ref, small=False)  # oneDNN only
    x = torch.randn(5, 576).to(dtype)
    tol = 1e-2 if dtype == BF16 else 1e-5
    for rows in (1, 4):
        assert torch.equal(fused(x[:rows]), small(x[:rows].contiguous(), lin.weight, lin.bias))
        torch.testing.assert_close(fused(x[:rows]).float(), plain(x[:rows]).float(),
                                   rtol=tol, atol=tol)  # fmt: skip
    assert torch.equal(fused(x), plain(x))  # 5 rows: the same oneDNN GEMM
    assert fused(x[:0]).shape == (0, 320)  # a step that samples no row
    bad = torch.nn.Linear(K_STEP[dtype] + 8, 8).to(
        dtype
    )  # K off the step: oneDNN at every row count
    assert OneDnnLinear(bad, small=True).plain_weight is None
