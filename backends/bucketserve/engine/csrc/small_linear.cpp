// Linears for decode steps of a few rows: y = x W^T (+ b), fp32 accumulation, one sequential
// pass over W's plain [N, K] rows. At these row counts a decode step only streams the weights,
// and oneDNN's packed GEMM (padded to 4 rows) streams them well below the memory's rate:
//  * bf16 on CPUs with AVX512-BF16 (1-4 rows): oneDNN read the SmolLM2 weight set at ~20 GB/s
//    on the 2-core Zen 4 VM, this loop at ~30 GB/s when a plain sum read 33-35 and up to ~50
//    when the sum read 50-60 (docs/measurements.md, 2026-12-06);
//  * float32 on CPUs with AVX2 and FMA but no AVX-512 (1-4 rows): oneDNN's AVX2 GEMM read the
//    fp32 weight set at 19 GB/s (4 rows) and 24 GB/s (1 row) on a 2-core AVX2 EPYC VM whose
//    plain sum read 31 GB/s. On AVX-512 CPUs fp32 keeps oneDNN: this loop has not been
//    measured against oneDNN's AVX-512 kernels there;
//  * bf16 on those AVX2 CPUs (1-16 rows; oneDNN has no bf16 GEMMs there, fusion.py packs a
//    float32 copy for larger steps): half fp32's bytes, widened to float32 in registers. 1-4
//    rows stream like fp32's loop; 5-16 rows run a blocked loop (two weight rows against
//    groups of 4 x rows) that took 0.49-0.70x the time of oneDNN's fp32 GEMM over the float32
//    copy at 5-8 rows and 0.68-0.95x at 12-16 (perf/engine/linear_bench.py). The same loop over
//    fp32 weights only tied oneDNN, so fp32 keeps oneDNN above 4 rows.
// Rows are split over torch's intra-op threads; each row keeps two accumulators per input row
// (alternate blocks) and is reduced once.
#include "common.h"
#include "kernels.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace bucketserve {

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define BUCKETSERVE_SMALL_AVX2 1
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

// fn(std::integral_constant<int, M>{}) for M = rows (1-4): the loops' row counts are template
// arguments, so each keeps its accumulators in registers.
template <typename Fn>
inline void with_rows(int64_t rows, Fn fn) {
  switch (rows) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    default: fn(std::integral_constant<int, 4>{}); break;
  }
}

}  // namespace

#if defined(BUCKETSERVE_SMALL_AVX2)
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

// bfloat16 on AVX2 (no bf16 instructions): a bf16 is the top half of a float, so a 256-bit load
// of 16 weights yields its 8 even-indexed ones as floats by a left shift of each 32-bit lane
// and its 8 odd-indexed ones by masking off the low half, with no shuffles. `xs` holds x in
// float32, each 16-element block de-interleaved to match (8 even, then 8 odd; `split_x`). The
// weights stream at half fp32's bytes; the math is fp32 FMAs, as oneDNN's bf16 GEMMs do.
template <int M>
void rows_times_weights_bf16_avx2(const float* xs, const bf16* w, const bf16* bias, bf16* out,
                                  int64_t n_out, int64_t k) {
  split_rows(n_out, [&](int64_t n0, int64_t n1) {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int64_t n = n0; n < n1; ++n) {
      const bf16* row = w + n * k;
      __m256 even[M], odd[M];
      for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm256_setzero_ps();
      for (int64_t b = 0; b < k; b += 32) {  // one 64-byte line: two blocks of 16
        _mm_prefetch(reinterpret_cast<const char*>(row + b) + 4 * 64, _MM_HINT_NTA);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b + 16));
        const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
        const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
        const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
        const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
        for (int m = 0; m < M; ++m) {
          const float* xm = xs + m * k + b;
          even[m] = _mm256_fmadd_ps(e0, _mm256_loadu_ps(xm), even[m]);
          odd[m] = _mm256_fmadd_ps(o0, _mm256_loadu_ps(xm + 8), odd[m]);
          even[m] = _mm256_fmadd_ps(e1, _mm256_loadu_ps(xm + 16), even[m]);
          odd[m] = _mm256_fmadd_ps(o1, _mm256_loadu_ps(xm + 24), odd[m]);
        }
      }
      const float add = bias ? f32(bias[n]) : 0.f;
      for (int m = 0; m < M; ++m)
        out[m * n_out + n] = cast<bf16>(hsum(_mm256_add_ps(even[m], odd[m])) + add);
    }
  });
}

// A block of 16 bf16 weights as two float vectors: its 8 even- and 8 odd-indexed ones (x
// de-interleaved by split_x to match).
inline void load16(const bf16* w, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Two weight rows (r0, r1) times MB rows of xs [MB, K] (float32, in load16's order): the
// 2 x MB dot products, each one 8-lane sum reduced once. Each x load feeds both rows.
template <int MB>
inline void two_by_rows(const float* xs, const bf16* r0, const bf16* r1, int64_t k, float* d0,
                        float* d1) {
  __m256 a0[MB], a1[MB];
  for (int m = 0; m < MB; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k; b += 16) {
    if ((b & 31) == 0) {  // once per 64-byte line, as the streaming loops (4-7 % here)
      _mm_prefetch(reinterpret_cast<const char*>(r0 + b) + 4 * 64, _MM_HINT_NTA);
      _mm_prefetch(reinterpret_cast<const char*>(r1 + b) + 4 * 64, _MM_HINT_NTA);
    }
    __m256 w0lo, w0hi, w1lo, w1hi;
    load16(r0 + b, w0lo, w0hi);
    load16(r1 + b, w1lo, w1hi);
    for (int m = 0; m < MB; ++m) {
      const __m256 xlo = _mm256_loadu_ps(xs + m * k + b);
      a0[m] = _mm256_fmadd_ps(w0lo, xlo, a0[m]);
      a1[m] = _mm256_fmadd_ps(w1lo, xlo, a1[m]);
      const __m256 xhi = _mm256_loadu_ps(xs + m * k + b + 8);
      a0[m] = _mm256_fmadd_ps(w0hi, xhi, a0[m]);
      a1[m] = _mm256_fmadd_ps(w1hi, xhi, a1[m]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    d0[m] = hsum(a0[m]);
    d1[m] = hsum(a1[m]);
  }
}
// y [M, N] = xs [M, K] W [N, K]^T (+ b), bf16 W and y, for M of 5-16 rows: each thread takes
// its share of W's rows two at a time and runs every group of 4 x rows over that pair while it
// sits in L1, so W streams from memory once and x (16 rows of K floats) from L2.
void blocked_rows_times_weights(const float* xs, const bf16* w, const bf16* bias, bf16* out,
                                int64_t rows, int64_t n_out, int64_t k) {
  split_rows(n_out, [&](int64_t n0, int64_t n1) {
    float d0[4], d1[4];
    for (int64_t n = n0; n < n1; n += 2) {
      const bf16* r0 = w + n * k;
      const bf16* r1 = n + 1 < n1 ? r0 + k : r0;  // an odd last row: computed twice, kept once
      const float b0 = bias ? f32(bias[n]) : 0.f;
      const float b1 = bias && n + 1 < n1 ? f32(bias[n + 1]) : 0.f;
      for (int64_t m = 0; m < rows; m += 4) {
        const float* xm = xs + m * k;
        const int64_t mb = std::min<int64_t>(4, rows - m);
        with_rows(mb, [&](auto g) { two_by_rows<decltype(g)::value>(xm, r0, r1, k, d0, d1); });
        for (int64_t i = 0; i < mb; ++i) {
          out[(m + i) * n_out + n] = cast<bf16>(d0[i] + b0);
          if (n + 1 < n1) out[(m + i) * n_out + n + 1] = cast<bf16>(d1[i] + b1);
        }
      }
    }
  });
}

// x [M, K] bf16 -> float32 with each block of 16 de-interleaved: [x0 x2 .. x14 x1 x3 .. x15].
void split_x(const bf16* x, float* xs, int64_t count) {
  for (int64_t b = 0; b < count; b += 16)
    for (int64_t i = 0; i < 8; ++i) {
      xs[b + i] = f32(x[b + 2 * i]);
      xs[b + 8 + i] = f32(x[b + 2 * i + 1]);
    }
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

int64_t small_linear_rows(at::ScalarType dtype) {
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return kGemvRows;
#endif
#if defined(BUCKETSERVE_SMALL_AVX2)
  if (dtype == at::kFloat) return kGemvRows;
  if (dtype == at::kBFloat16) return kBlockedRows;
#endif
  return 0;
}

// K must be a multiple of a weight row's vector step: 32 bf16 or 16 floats (one 64-byte line).
inline int64_t small_linear_step(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 32 : 16; }

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x must be [M, K] and weight [N, K]");
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(x.scalar_type() == dtype && (dtype == at::kBFloat16 || dtype == at::kFloat),
              "small_linear takes x and weight of one dtype, bfloat16 or float32");
  const int64_t max_rows = small_linear_rows(dtype);
  TORCH_CHECK(max_rows > 0, "small_linear in ", dtype,
              " needs a build with AVX512-BF16 (bfloat16) or AVX2 + FMA without AVX-512 "
              "(both dtypes); this CPU or compiler has neither");
  const int64_t rows = x.size(0), k = x.size(1), n_out = weight.size(0);
  TORCH_CHECK(rows >= 1 && rows <= max_rows, "x must have 1 to ", max_rows, " rows in ", dtype,
              " on this CPU, got ", rows);
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
    with_rows(rows, [&](auto m) {
      rows_times_weights<decltype(m)::value>(xp, wp, bp, op, n_out, k);
    });
  }
#endif
#if defined(BUCKETSERVE_SMALL_AVX2)
  if (dtype == at::kBFloat16) {
    std::vector<float> xs(rows * k);
    split_x(x.data_ptr<bf16>(), xs.data(), rows * k);
    const bf16* wp = weight.data_ptr<bf16>();
    const bf16* bp = static_cast<const bf16*>(b);
    bf16* op = out.data_ptr<bf16>();
    if (rows > kGemvRows) {
      blocked_rows_times_weights(xs.data(), wp, bp, op, rows, n_out, k);
    } else {
      with_rows(rows, [&](auto m) {
        rows_times_weights_bf16_avx2<decltype(m)::value>(xs.data(), wp, bp, op, n_out, k);
      });
    }
  }
  if (dtype == at::kFloat) {
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = static_cast<const float*>(b);
    float* op = out.data_ptr<float>();
    with_rows(rows, [&](auto m) {
      rows_times_weights_f32<decltype(m)::value>(xp, wp, bp, op, n_out, k);
    });
  }
#endif
  return out;
}

}  // namespace bucketserve
