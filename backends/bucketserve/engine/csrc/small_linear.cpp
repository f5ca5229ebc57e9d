// Linears for decode steps of 1-4 rows: y = x W^T (+ b), fp32 accumulation, one sequential
// pass over W's plain [N, K] rows. At these row counts a decode step only streams the weights,
// and oneDNN's packed GEMM (padded to 4 rows) streams them well below the memory's rate:
//  * bf16 on CPUs with AVX512-BF16: oneDNN read the SmolLM2 weight set at ~20 GB/s on the
//    2-core Zen 4 VM, this loop at ~30 GB/s when a plain sum read 33-35 and up to ~50 when the
//    sum read 50-60 (docs/measurements.md, 2026-12-06);
//  * float32 on CPUs with AVX2 and FMA but no AVX-512: oneDNN's AVX2 GEMM read the fp32 weight
//    set at 19 GB/s (4 rows) and 24 GB/s (1 row) on a 2-core AVX2 EPYC VM whose plain sum read
//    31 GB/s (docs/measurements.md, 2026-12-06). On AVX-512 CPUs fp32 keeps oneDNN: this loop
//    has not been measured against oneDNN's AVX-512 kernels there.
// Rows are split over torch's intra-op threads; each row keeps two accumulators per input row
// (alternate blocks) and is reduced once.
#include "common.h"
#include "kernels.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>

#if defined(__AVX512BF16__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace bucketserve {

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define BUCKETSERVE_SMALL_F32 1
#endif

namespace {

// Calls row_fn(n0, n1) on each thread for its contiguous share of n_out rows, through OpenMP
// directly rather than at::parallel_for (its per-call set-up, paid ~120 times a step: 3-5 % of
// the layer set's GEMV time in interleaved rounds). Nested in another parallel region it runs
// on one thread.
template <typename Fn>
inline void split_rows(int64_t n_out, Fn row_fn) {
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), (n_out + 63) / 64));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t share = (n_out + omp_get_num_threads() - 1) / omp_get_num_threads();
    const int64_t n0 = std::min(n_out, omp_get_thread_num() * share);
    row_fn(n0, std::min(n_out, n0 + share));
  }
}

}  // namespace

#if defined(BUCKETSERVE_SMALL_F32)
namespace {

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// float32, K a multiple of 16: each 64-byte line of a weight row feeds two accumulators per
// input row (its two 8-float halves); a non-temporal prefetch 4 lines ahead as in bf16.
template <int M>
void rows_times_weights_f32(const float* x, const float* w, const float* bias, float* out,
                            int64_t n_out, int64_t k) {
  split_rows(n_out, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* row = w + n * k;
      __m256 even[M], odd[M];
      for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm256_setzero_ps();
      for (int64_t b = 0; b < k; b += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(row + b) + 4 * 64, _MM_HINT_NTA);
        const __m256 w0 = _mm256_loadu_ps(row + b), w1 = _mm256_loadu_ps(row + b + 8);
        for (int m = 0; m < M; ++m) {
          even[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * k + b), even[m]);
          odd[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * k + b + 8), odd[m]);
        }
      }
      const float add = bias ? bias[n] : 0.f;
      for (int m = 0; m < M; ++m) out[m * n_out + n] = hsum(_mm256_add_ps(even[m], odd[m])) + add;
    }
  });
}

}  // namespace
#endif

#if defined(__AVX512BF16__)
namespace {

// 4 cache lines: 1.1-1.7x the GEMV rate without it on the SmolLM2 layer set (2 threads; the
// most at the highest bandwidth); 8 and more lines gained less (docs/measurements.md).
constexpr int64_t kPrefetchBytes = 4 * 64;

template <int M>
void rows_times_weights(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t n_out,
                        int64_t k) {
  const int64_t blocks = k / 32;
  split_rows(n_out, [&](int64_t n0, int64_t n1) {
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
  });
}

}  // namespace
#endif

bool small_linear_available(at::ScalarType dtype) {
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return true;
#endif
#if defined(BUCKETSERVE_SMALL_F32)
  if (dtype == at::kFloat) return true;
#endif
  return false;
}

// K must be a multiple of a weight row's vector step: 32 bf16 or 16 floats (one 64-byte line).
inline int64_t small_linear_step(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 32 : 16; }

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [M, K] and weight [N, K]");
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(x.scalar_type() == dtype && (dtype == at::kBFloat16 || dtype == at::kFloat),
              "small_linear takes x and weight of one dtype, bfloat16 or float32");
  TORCH_CHECK(small_linear_available(dtype), "small_linear in ", dtype,
              " needs a build with AVX512-BF16 (bfloat16) or AVX2 + FMA without AVX-512 "
              "(float32); this CPU or compiler has neither");
  const int64_t rows = x.size(0), k = x.size(1), n_out = weight.size(0);
  TORCH_CHECK(rows >= 1 && rows <= kSmallLinearRows, "x must have 1 to ", kSmallLinearRows,
              " rows, got ", rows);
  const int64_t step = small_linear_step(dtype);
  TORCH_CHECK(weight.size(1) == k && k % step == 0, "weight must be [N, ", k,
              "] with K a multiple of ", step, ", got ", weight.sizes());
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
  const void* b = nullptr;
  if (bias && bias->numel()) {
    TORCH_CHECK(bias->scalar_type() == dtype && bias->numel() == n_out && bias->is_contiguous(),
                "bias must be a contiguous ", dtype, " [", n_out, "]");
    b = bias->data_ptr();
  }
  at::Tensor out = at::empty({rows, n_out}, x.options());
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) {
    const bf16* xp = x.data_ptr<bf16>();
    const bf16* wp = weight.data_ptr<bf16>();
    const bf16* bp = static_cast<const bf16*>(b);
    bf16* op = out.data_ptr<bf16>();
    switch (rows) {
      case 1: rows_times_weights<1>(xp, wp, bp, op, n_out, k); break;
      case 2: rows_times_weights<2>(xp, wp, bp, op, n_out, k); break;
      case 3: rows_times_weights<3>(xp, wp, bp, op, n_out, k); break;
      default: rows_times_weights<4>(xp, wp, bp, op, n_out, k); break;
    }
  }
#endif
#if defined(BUCKETSERVE_SMALL_F32)
  if (dtype == at::kFloat) {
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = static_cast<const float*>(b);
    float* op = out.data_ptr<float>();
    switch (rows) {
      case 1: rows_times_weights_f32<1>(xp, wp, bp, op, n_out, k); break;
      case 2: rows_times_weights_f32<2>(xp, wp, bp, op, n_out, k); break;
      case 3: rows_times_weights_f32<3>(xp, wp, bp, op, n_out, k); break;
      default: rows_times_weights_f32<4>(xp, wp, bp, op, n_out, k); break;
    }
  }
#endif
  return out;
}

}  // namespace bucketserve
