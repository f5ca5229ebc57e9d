// Paged attention for the decode step: reads the KV pool through the block tables (no gather,
// no padding mask). q, caches and output float32 or bfloat16; scores, softmax and the weighted
// sum of values in float32.
//
// Each sequence's context is cut into parts of kPartTokens tokens (flash-decoding's split):
// a part yields its rows' running max, exp-sum and unnormalised output, and the parts are
// merged once at the end. Parts are what makes a single long sequence use every thread (batch
// 1 decode, SmolLM2: 3 KV heads, which left one of 2 threads idle for a third of the time).
// The cut depends on the context length only, never on the batch or the thread count, so a
// sequence's result is the same in any batch.
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common.h"

namespace bucketserve {

namespace {

constexpr int64_t kPartTokens = 64;

// A layer's paged K/V caches: [num_blocks, block_size, KVH, D] with shared strides.
template <typename T>
struct PagedKv {
  const T* k;
  const T* v;
  int64_t block_stride, token_stride, head_stride, block_size, head_dim;
};

// Tokens a part's walk prefetches ahead: cold KV blocks sit at scattered addresses that the
// hardware prefetchers re-learn at every block, and the loads' latency, not bandwidth, set the
// kernel's speed (batch 64 x 160 tokens: 30 layers ~29 ms before, see docs/measurements.md).
constexpr int64_t kAheadTokens = 8;

// Calls fn(t, row) for tokens t0 <= t < t1 of a sequence in order, where row points at token
// t's first head in `cache` (kv.k or kv.v), walking the block table block by block; the
// `bytes` from `offset` of token t + kAheadTokens's row are prefetched meanwhile.
template <typename T, typename Fn>
inline void for_each_token(const T* cache, const PagedKv<T>& kv, const int32_t* table, int64_t t0,
                           int64_t t1, int64_t offset, int64_t bytes, Fn fn) {
  const int64_t bs = kv.block_size;
  // The prefetch cursor: token `ahead` at `slot` of block index `blk`.
  int64_t ahead = std::min(t1, t0 + kAheadTokens), blk = ahead / bs, slot = ahead % bs;
  for (int64_t t = t0; t < t1;) {
    const T* block = cache + table[t / bs] * kv.block_stride;
    const int64_t stop = std::min(t1, (t / bs + 1) * bs);
    for (const T* row = block + t % bs * kv.token_stride; t < stop; ++t, row += kv.token_stride) {
      if (ahead < t1) {
        const char* p = reinterpret_cast<const char*>(
            cache + table[blk] * kv.block_stride + slot * kv.token_stride + offset);
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
        ++ahead;
        if (++slot == bs) slot = 0, ++blk;
      }
      fn(t, row);
    }
  }
}

#if defined(__AVX512F__)
constexpr int64_t kMaxVecDim = 256;  // head_dim the vector path keeps in registers (16 x 16)

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {  // bf16 -> float: the 16 bits become the high half
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 CPUs without AVX-512 (most laptops): the same loops 8 floats wide. Kept apart from the
// AVX-512 code rather than shared through a width-generic wrapper, so that path stays as
// measured (docs/measurements.md).
#define BUCKETSERVE_AVX2_ATTENTION 1
constexpr int64_t kMaxVecDim = 256;  // head_dim the vector path handles (32 x 8)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {  // bf16 -> float: the 16 bits become the high half
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline float sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

// s[g * stride] = scale * (q row g . key) for the G query rows that share one KV head.
// C: dim / 16 when known at compile time (the loops unroll, the row stays in registers; AVX2
// takes 2C chunks of 8), else 0.
template <int C, typename T>
inline void key_scores(const float* q, const T* key, int64_t group, int64_t dim, float scale,
                       float* s, int64_t stride) {
#if defined(__AVX512F__)
  if (dim % 16 == 0 && dim <= kMaxVecDim) {
    __m512 k[kMaxVecDim / 16];
    const int64_t chunks = C ? C : dim / 16;
    for (int64_t c = 0; c < chunks; ++c) k[c] = load16(key + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * dim;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), k[0]);
      for (int64_t c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + c * 16), k[c], acc);
      s[g * stride] = _mm512_reduce_add_ps(acc) * scale;
    }
    return;
  }
#elif defined(BUCKETSERVE_AVX2_ATTENTION)
  if (dim % 8 == 0 && dim <= kMaxVecDim) {
    __m256 k[kMaxVecDim / 8];
    const int64_t chunks = C ? 2 * C : dim / 8;
    for (int64_t c = 0; c < chunks; ++c) k[c] = load8(key + c * 8);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * dim;
      // Two sums (even and odd chunks): one chain of dim / 8 dependent FMAs was latency-bound.
      __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
      int64_t c = 0;
      for (; c + 1 < chunks; c += 2) {
        even = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c * 8), k[c], even);
        odd = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c * 8 + 8), k[c + 1], odd);
      }
      if (c < chunks) even = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c * 8), k[c], even);
      s[g * stride] = sum8(_mm256_add_ps(even, odd)) * scale;
    }
    return;
  }
#endif
  for (int64_t g = 0; g < group; ++g) {
    float sum = 0.f;
    for (int64_t d = 0; d < dim; ++d) sum += q[g * dim + d] * f32(key[d]);
    s[g * stride] = sum * scale;
  }
}

#if defined(__AVX512BF16__)
// bf16 q and keys: the products pairwise by vdpbf16ps (each bf16 x bf16 product is exact in
// float32), D / 32 instructions per row and no conversion of the key.
template <int C>
inline void key_scores_bf16(const bf16* q, const bf16* key, int64_t group, int64_t dim,
                            float scale, float* s, int64_t stride) {
  __m512bh k[kMaxVecDim / 32];
  const int64_t chunks = C ? C / 2 : dim / 32;
  for (int64_t c = 0; c < chunks; ++c) k[c] = (__m512bh)_mm512_loadu_si512(key + c * 32);
  for (int64_t g = 0; g < group; ++g) {
    const bf16* qg = q + g * dim;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c)
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qg + c * 32), k[c]);
    s[g * stride] = _mm512_reduce_add_ps(acc) * scale;
  }
}
#endif

// acc row g += p[g * stride] * value, for the G query rows that share one KV head.
template <int C, typename T>
inline void add_value(float* acc, const float* p, int64_t stride, const T* value, int64_t group,
                      int64_t dim) {
#if defined(__AVX512F__)
  if (dim % 16 == 0 && dim <= kMaxVecDim) {
    __m512 v[kMaxVecDim / 16];
    const int64_t chunks = C ? C : dim / 16;
    for (int64_t c = 0; c < chunks; ++c) v[c] = load16(value + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * stride]);
      float* ag = acc + g * dim;
      for (int64_t c = 0; c < chunks; ++c)
        _mm512_storeu_ps(ag + c * 16, _mm512_fmadd_ps(w, v[c], _mm512_loadu_ps(ag + c * 16)));
    }
    return;
  }
#elif defined(BUCKETSERVE_AVX2_ATTENTION)
  if (dim % 8 == 0 && dim <= kMaxVecDim) {
    __m256 v[kMaxVecDim / 8];
    const int64_t chunks = C ? 2 * C : dim / 8;
    for (int64_t c = 0; c < chunks; ++c) v[c] = load8(value + c * 8);
    for (int64_t g = 0; g < group; ++g) {
      const __m256 w = _mm256_set1_ps(p[g * stride]);
      float* ag = acc + g * dim;
      for (int64_t c = 0; c < chunks; ++c)
        _mm256_storeu_ps(ag + c * 8, _mm256_fmadd_ps(w, v[c], _mm256_loadu_ps(ag + c * 8)));
    }
    return;
  }
#endif
  for (int64_t g = 0; g < group; ++g) {
    const float w = p[g * stride];
    for (int64_t d = 0; d < dim; ++d) acc[g * dim + d] += w * f32(value[d]);
  }
}

// One part: query heads [h0 * G, h1 * G) of one sequence over its tokens [t0, t1).
// q: those heads' rows of D floats; scores: room for rows * (t1 - t0) floats. Writes per row
// its max score, its sum of exp(score - max) and, into acc, its exp-weighted sum of values.
// q_raw: the same rows as T when they are contiguous, else null (bf16 scores read them as is).
// C: as key_scores.
template <int C, typename T>
void attend_part(const PagedKv<T>& kv, const int32_t* table, int64_t t0, int64_t t1, int64_t h0,
                 int64_t h1, int64_t group, const float* q, const T* q_raw, float scale,
                 float* scores, float* row_max, float* row_sum, float* acc) {
  const int64_t rows = (h1 - h0) * group, dim = kv.head_dim, n = t1 - t0;
  bool raw = false;
#if defined(__AVX512BF16__)
  raw = std::is_same_v<T, bf16> && q_raw && dim % 32 == 0 && dim <= kMaxVecDim;
#endif
  const int64_t offset = h0 * kv.head_stride, bytes = (h1 - h0) * kv.head_stride * sizeof(T);
  for_each_token(kv.k, kv, table, t0, t1, offset, bytes, [&](int64_t t, const T* token) {
    for (int64_t h = h0; h < h1; ++h) {
      float* s = scores + (h - h0) * group * n + (t - t0);
      const T* key = token + h * kv.head_stride;
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, bf16>) {
        if (raw) {
          key_scores_bf16<C>(q_raw + (h - h0) * group * dim, key, group, dim, scale, s, n);
          continue;
        }
      }
#endif
      key_scores<C>(q + (h - h0) * group * dim, key, group, dim, scale, s, n);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = scores + r * n;
    const float m = *std::max_element(sr, sr + n);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      sr[t] = vexp(sr[t] - m);
      sum += sr[t];
    }
    row_max[r] = m;
    row_sum[r] = sum;
  }
  std::fill(acc, acc + rows * dim, 0.f);
  for_each_token(kv.v, kv, table, t0, t1, offset, bytes, [&](int64_t t, const T* token) {
    for (int64_t h = h0; h < h1; ++h)
      add_value<C>(acc + (h - h0) * group * dim, scores + (h - h0) * group * n + (t - t0), n,
                token + h * kv.head_stride, group, dim);
  });
}

// Checks block tables and context lengths against the pool; returns the longest context.
int64_t check_tables(const at::Tensor& tables, const at::Tensor& lens, int64_t batch,
                     int64_t num_blocks, int64_t block_size) {
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == batch, "block_tables must be [B, max_blocks]");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == batch, "context_lens must be [B]");
  const int64_t max_blocks = tables.size(1);
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  int64_t max_len = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = len_ptr[b];
    TORCH_CHECK(n >= 1 && n <= max_blocks * block_size, "context_lens[", b, "] = ", n,
                " is outside [1, ", max_blocks * block_size, "]");
    for (int64_t i = 0; i < (n + block_size - 1) / block_size; ++i) {
      const int64_t blk = table_ptr[b * max_blocks + i];
      TORCH_CHECK(blk >= 0 && blk < num_blocks, "block_tables[", b, "][", i, "] = ", blk,
                  " is outside the pool of ", num_blocks, " blocks");
    }
    max_len = std::max(max_len, n);
  }
  return max_len;
}

inline int64_t parts_of(int64_t n) { return (n + kPartTokens - 1) / kPartTokens; }

}  // namespace

// q [B, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
// int32; context_lens [B] int32 (tokens to attend, including this step's) -> out [B, H, D].
// The G = H / KVH query heads that share a KV head are handled together, so each key and
// value row is read once per (sequence, KV head, part).
at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale) {
  check_cpu(q, "q");
  check_cpu(k_cache, "k_cache", q.scalar_type());
  check_cpu(v_cache, "v_cache", q.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q must be [B, H, D] and the caches [num_blocks, block_size, KVH, D]");
  TORCH_CHECK(k_cache.stride(0) == v_cache.stride(0) && k_cache.stride(1) == v_cache.stride(1) &&
                  k_cache.stride(2) == v_cache.stride(2),
              "k_cache and v_cache must share one layout");
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim, "head_dim of q and the caches differ");
  TORCH_CHECK(num_heads % kv_heads == 0, "num_heads must be a multiple of the KV heads");
  auto tables = block_tables.to(at::kInt).contiguous();
  auto lens = context_lens.to(at::kInt).contiguous();
  check_tables(tables, lens, batch, k_cache.size(0), block_size);
  const int64_t max_blocks = tables.size(1);
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  auto out = at::empty({batch, num_heads, head_dim}, q.options());
  const int64_t group = num_heads / kv_heads;
  // A work item: one part of one sequence's KV heads [h0, h1): all heads when there are
  // enough sequences (each token's heads are then read together), single heads otherwise.
  const int64_t heads_per_item = batch >= at::get_num_threads() ? kv_heads : 1;
  const int64_t items_per_part = kv_heads / heads_per_item;
  const int64_t rows = heads_per_item * group;  // query rows of one item
  // first[b]: sequence b's first part; its parts are first[b] .. first[b + 1] - 1.
  std::vector<int64_t> first(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) first[b + 1] = first[b] + parts_of(len_ptr[b]);
  const int64_t parts = first[batch];
  // Per (part, head item): max and sum of each row, then its rows' D floats.
  const int64_t item_floats = rows * (2 + head_dim);
  std::vector<float> partial(parts * items_per_part * item_floats);
  const float fscale = static_cast<float>(scale);

  dispatch(q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const PagedKv<T> kv{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_cache.stride(0),
                        k_cache.stride(1), k_cache.stride(2), block_size, head_dim};
    const T* q_ptr = q.data_ptr<T>();
    T* out_ptr = out.data_ptr<T>();
    at::parallel_for(0, parts * items_per_part, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(rows * kPartTokens), q_rows(rows * head_dim);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t part = item / items_per_part;
        const int64_t h0 = item % items_per_part * heads_per_item;
        const int64_t b = std::upper_bound(first.begin(), first.end(), part) - first.begin() - 1;
        const int64_t t0 = (part - first[b]) * kPartTokens;
        const int64_t t1 = std::min<int64_t>(len_ptr[b], t0 + kPartTokens);
        for (int64_t r = 0; r < rows; ++r) {  // q rows as float, read once per key
          const T* src = q_ptr + b * q.stride(0) + (h0 * group + r) * q.stride(1);
          for (int64_t d = 0; d < head_dim; ++d) q_rows[r * head_dim + d] = f32(src[d]);
        }
        float* p = partial.data() + item * item_floats;
        const T* q_raw = q.stride(1) == head_dim
                             ? q_ptr + b * q.stride(0) + h0 * group * head_dim : nullptr;
        const auto run_part = [&](auto chunks) {
          attend_part<decltype(chunks)::value>(kv, table_ptr + b * max_blocks, t0, t1, h0,
                                               h0 + heads_per_item, group, q_rows.data(), q_raw,
                                               fscale, scores.data(), p, p + rows, p + 2 * rows);
        };
        if (head_dim == 64) run_part(std::integral_constant<int, 4>{});
        else if (head_dim == 128) run_part(std::integral_constant<int, 8>{});
        else run_part(std::integral_constant<int, 0>{});
      }
    });
    // Merge each (sequence, head item)'s parts: rescale each to the largest max, normalise.
    const int64_t merge_grain = std::max<int64_t>(1, 16384 / (item_floats * (parts / batch + 1)));
    at::parallel_for(0, batch * items_per_part, merge_grain, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(rows * head_dim), total(rows), top(rows);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / items_per_part, h0 = i % items_per_part * heads_per_item;
        const float* base = partial.data() + first[b] * items_per_part * item_floats;
        const int64_t n_parts = first[b + 1] - first[b];
        std::fill(top.begin(), top.end(), -std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < n_parts; ++j) {
          const float* p = base + (j * items_per_part + i % items_per_part) * item_floats;
          for (int64_t r = 0; r < rows; ++r) top[r] = std::max(top[r], p[r]);
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        std::fill(total.begin(), total.end(), 0.f);
        for (int64_t j = 0; j < n_parts; ++j) {
          const float* p = base + (j * items_per_part + i % items_per_part) * item_floats;
          for (int64_t r = 0; r < rows; ++r) {
            const float w = vexp(p[r] - top[r]);
            total[r] += w * p[rows + r];
            const float* pr = p + 2 * rows + r * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) acc[r * head_dim + d] += w * pr[d];
          }
        }
        T* dst = out_ptr + (b * num_heads + h0 * group) * head_dim;
        for (int64_t r = 0; r < rows; ++r) {
          const float inv = 1.f / total[r];
          for (int64_t d = 0; d < head_dim; ++d)
            dst[r * head_dim + d] = cast<T>(acc[r * head_dim + d] * inv);
        }
      }
    });
  });
  return out;
}

}  // namespace bucketserve
