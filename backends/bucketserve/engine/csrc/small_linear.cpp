// bf16 linears for decode steps of 1-4 rows, on CPUs with AVX512-BF16: y = x W^T (+ b), fp32
// accumulation, one sequential pass over W's plain [N, K] rows. At these row counts a decode
// step only streams the weights; oneDNN's packed GEMM (padded to 4 rows) read the SmolLM2
// weight set at ~20 GB/s on the 2-core VM, this loop at ~30 GB/s when a plain sum read 33-35
// and up to ~50 when the sum read 50-60 (docs/measurements.md, 2026-12-06). Rows are split
// over torch's intra-op threads; each row keeps two accumulators per input row (alternate
// 32-element blocks) and is reduced once.
#include "common.h"
#include "kernels.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace bucketserve {

#if defined(__AVX512BF16__)
namespace {

// 4 cache lines: 1.1-1.7x the GEMV rate without it on the SmolLM2 layer set (2 threads; the
// most at the highest bandwidth); 8 and more lines gained less (docs/measurements.md).
constexpr int64_t kPrefetchBytes = 4 * 64;

template <int M>
void rows_times_weights(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t n_out,
                        int64_t k) {
  const int64_t blocks = k / 32;
  // One contiguous share of the rows per thread, through OpenMP directly rather than
  // at::parallel_for (its per-call set-up, paid ~120 times a step: 3-5 % of the layer set's
  // GEMV time in interleaved rounds). Nested in another parallel region it runs on one thread.
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), (n_out + 63) / 64));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t share = (n_out + omp_get_num_threads() - 1) / omp_get_num_threads();
    const int64_t n0 = std::min(n_out, omp_get_thread_num() * share), n1 = std::min(n_out, n0 + share);
    for (int64_t n = n0; n < n1; ++n) {
      const bf16* row = w + n * k;
      __m512 even[M], odd[M];
      for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_ps();
      int64_t b = 0;
      for (; b + 1 < blocks; b += 2) {
        // A non-temporal prefetch a few lines ahead: the weights stream through L1 without
        // filling L2/L3, and the core keeps more reads in flight than its prefetchers do.
        const char* ahead = reinterpret_cast<const char*>(row + b * 32) + kPrefetchBytes;
        _mm_prefetch(ahead, _MM_HINT_NTA);
        _mm_prefetch(ahead + 64, _MM_HINT_NTA);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(row + b * 32);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(row + b * 32 + 32);
        for (int m = 0; m < M; ++m) {
          const bf16* xm = x + m * k + b * 32;
          even[m] = _mm512_dpbf16_ps(even[m], w0, (__m512bh)_mm512_loadu_si512(xm));
          odd[m] = _mm512_dpbf16_ps(odd[m], w1, (__m512bh)_mm512_loadu_si512(xm + 32));
        }
      }
      if (b < blocks) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(row + b * 32);
        for (int m = 0; m < M; ++m)
          even[m] = _mm512_dpbf16_ps(even[m], w0, (__m512bh)_mm512_loadu_si512(x + m * k + b * 32));
      }
      const float add = bias ? f32(bias[n]) : 0.f;
      for (int m = 0; m < M; ++m)
        out[m * n_out + n] = cast<bf16>(_mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m])) + add);
    }
  }
}

}  // namespace
#endif

bool small_linear_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(small_linear_available(),
              "small_linear needs a build with AVX512-BF16 (this CPU or compiler has none)");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [M, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "small_linear takes bfloat16 x and weight");
  const int64_t rows = x.size(0), k = x.size(1), n_out = weight.size(0);
  TORCH_CHECK(rows >= 1 && rows <= kSmallLinearRows, "x must have 1 to ", kSmallLinearRows,
              " rows, got ", rows);
  TORCH_CHECK(weight.size(1) == k && k % 32 == 0, "weight must be [N, ", k,
              "] with K a multiple of 32, got ", weight.sizes());
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
  const bf16* b = nullptr;
  if (bias && bias->numel()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n_out &&
                    bias->is_contiguous(),
                "bias must be a contiguous bfloat16 [", n_out, "]");
    b = bias->data_ptr<bf16>();
  }
  at::Tensor out = at::empty({rows, n_out}, x.options());
#if defined(__AVX512BF16__)
  const bf16* xp = x.data_ptr<bf16>();
  const bf16* wp = weight.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  switch (rows) {
    case 1: rows_times_weights<1>(xp, wp, b, op, n_out, k); break;
    case 2: rows_times_weights<2>(xp, wp, b, op, n_out, k); break;
    case 3: rows_times_weights<3>(xp, wp, b, op, n_out, k); break;
    default: rows_times_weights<4>(xp, wp, b, op, n_out, k); break;
  }
#endif
  return out;
}

}  // namespace bucketserve
