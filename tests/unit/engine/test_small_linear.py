"""torch.ops.bucketserve.small_linear (csrc/small_linear.cpp), the linears of decode steps of
1-4 rows: bf16 on CPUs with AVX512-BF16, both dtypes on AVX2 CPUs without AVX-512. Each dtype's
tests run where the CPU has its kernel and skip, saying so, elsewhere; which dtypes a CPU runs
is itself checked against its flags."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine import cpu_ops
from bucketserve.engine.fusion import OneDnnLinear, small_linear_available, small_linear_rows

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
    avx2_only = {"avx2", "fma"} <= flags and "avx512f" not in flags
    assert small_linear_rows(BF16) == (16 if avx2_only else 4 if "avx512_bf16" in flags else 0)
    assert small_linear_rows(F32) == (4 if avx2_only else 0)
    assert small_linear_available(BF16) == ("avx512_bf16" in flags or avx2_only)
    assert small_linear_available(F32) == avx2_only
    assert not small_linear_available(torch.float16) and small_linear_rows(torch.float16) == 0


@pytest.fixture(params=[BF16, F32], ids=["bfloat16", "float32"])
def dtype(request):
    if not small_linear_available(request.param):
        pytest.skip(f"small_linear has no {request.param} kernel on this CPU; the bf16 tests run "
                    "on CPUs with AVX512-BF16 (Zen 4, Cooper Lake and later) or AVX2 + FMA "
                    "without AVX-512 (most laptops), the float32 ones on the latter")  # fmt: skip
    return request.param


@pytest.mark.parametrize(
    ("k", "bias", "n_out"), [(576, False, 200), (96, True, 201), (1536, False, 200)]
)
def test_small_linear_matches_a_float32_matmul(dtype, k, bias, n_out):
    """x W^T (+ b) with fp32 accumulation, rounded once: within the dtype's rounding of the
    float32 product of the same inputs, at every row count it takes (the streaming loops'
    1-4 rows and, bf16 on AVX2, the blocked loop's 5-16 in groups of 4 and a rest; odd and even
    block counts, an odd number of weight rows, with a bias)."""
    for rows in range(1, small_linear_rows(dtype) + 1):
        g = torch.Generator().manual_seed(rows * k)
        x = torch.randn(rows, k, generator=g).to(dtype)
        w = (0.05 * torch.randn(n_out, k, generator=g)).to(dtype)
        b = torch.randn(n_out, generator=g).to(dtype) if bias else None
        ref = x.double() @ w.double().T + (b.double() if bias else 0)
        got = torch.ops.bucketserve.small_linear(x, w, b)
        assert got.dtype == dtype and got.shape == (rows, n_out)
        tol = 8e-3 if dtype == BF16 else 1e-5
        torch.testing.assert_close(got.double(), ref, rtol=tol,
                                   atol=tol * ref.abs().max().item(), msg=f"{rows} rows")  # fmt: skip


def test_small_linear_rejects_what_it_does_not_run(dtype):
    small = torch.ops.bucketserve.small_linear
    step = K_STEP[dtype]
    w = torch.zeros(8, 64, dtype=dtype)
    most = small_linear_rows(dtype)
    with pytest.raises(RuntimeError, match=f"x must have 1 to {most} rows in .*, got {most + 1}"):
        small(torch.zeros(most + 1, 64, dtype=dtype), w, None)
    odd = step + step // 2
    with pytest.raises(RuntimeError, match=f"K a multiple of {step}"):
        small(torch.zeros(1, odd, dtype=dtype), torch.zeros(8, odd, dtype=dtype), None)
    with pytest.raises(RuntimeError, match="x and weight of one dtype"):
        small(
            torch.zeros(1, 64, dtype=torch.float16), torch.zeros(8, 64, dtype=torch.float16), None
        )
    with pytest.raises(RuntimeError, match="x and weight of one dtype"):
        small(torch.zeros(1, 64, dtype=dtype), torch.zeros(8, 64, dtype=torch.float64), None)


def test_linears_run_small_linear_up_to_its_rows_and_onednn_above(dtype):
    small = torch.ops.bucketserve.small_linear
    lin = torch.nn.Linear(576, 320, bias=True).to(dtype)
    fused = OneDnnLinear(lin, small=True)
    most = small_linear_rows(dtype)
    assert fused.plain_weight is not None and fused.small_rows == most
    ref = torch.nn.Linear(576, 320, bias=True).to(dtype)
    ref.load_state_dict(lin.state_dict())
    plain = OneDnnLinear(ref, small=False)  # oneDNN only
    assert plain.small_rows == 0
    x = torch.randn(most + 1, 576).to(dtype)
    tol = 1e-2 if dtype == BF16 else 1e-5
    for rows in sorted({1, 4, most}):
        assert torch.equal(fused(x[:rows]), small(x[:rows].contiguous(), lin.weight, lin.bias))
        torch.testing.assert_close(fused(x[:rows]).float(), plain(x[:rows]).float(),
                                   rtol=tol, atol=tol)  # fmt: skip
    assert torch.equal(fused(x), plain(x))  # one row more: the same oneDNN GEMM
    assert fused(x[:0]).shape == (0, 320)  # a step that samples no row
    bad = torch.nn.Linear(K_STEP[dtype] + 8, 8).to(
        dtype
    )  # K off the step: oneDNN at every row count
    assert OneDnnLinear(bad, small=True).plain_weight is None
