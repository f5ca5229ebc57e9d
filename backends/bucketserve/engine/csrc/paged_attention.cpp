// Paged attention for the decode step: reads the KV pool through the block tables (no gather,
// no padding mask). q, caches and output float32 or bfloat16; scores, softmax and the weighted
// sum of values in float32. Work items run in parallel on ATen's thread pool.
#include <ATen/Parallel.h>

#include <limits>
#include <vector>

#include "common.h"

namespace bucketserve {

namespace {

template <typename T>
inline void axpy(float* y, float alpha, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * f32(x[i]);
}

// A layer's paged K/V caches: [num_blocks, block_size, KVH, D] with shared strides.
template <typename T>
struct PagedKv {
  const T* k;
  const T* v;
  int64_t block_stride, token_stride, head_stride, block_size, head_dim;
};

// Calls fn(t, row) for each of a sequence's n cached tokens in order, where row points at
// token t's first head in `cache` (kv.k or kv.v), walking the block table block by block.
template <typename T, typename Fn>
inline void for_each_token(const T* cache, const PagedKv<T>& kv, const int32_t* table, int64_t n,
                           Fn fn) {
  const int64_t bs = kv.block_size;
  for (int64_t i = 0, start = 0; start < n; ++i, start += bs) {
    const T* block = cache + table[i] * kv.block_stride;
    for (int64_t t = start; t < std::min(n, start + bs); ++t) {
      fn(t, block + (t - start) * kv.token_stride);
    }
  }
}

// Attention of query heads [h0 * G, h1 * G) of one sequence over its n cached tokens.
// q: those heads' (h1 - h0) * G rows of D floats; out: their output rows (same layout);
// scores: room for (h1 - h0) * G * n floats.
template <typename T>
void attend(const PagedKv<T>& kv, const int32_t* table, int64_t n, int64_t h0, int64_t h1,
            int64_t group, const float* q, float scale, float* scores, float* out) {
  const int64_t rows = (h1 - h0) * group, dim = kv.head_dim;
  std::vector<float> row_max(rows, -std::numeric_limits<float>::infinity());
  for_each_token(kv.k, kv, table, n, [&](int64_t t, const T* token) {
    for (int64_t h = h0; h < h1; ++h) {
      const T* key = token + h * kv.head_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = (h - h0) * group + g;
        const float s = dot(q + r * dim, key, dim) * scale;
        scores[r * n + t] = s;
        row_max[r] = std::max(row_max[r], s);
      }
    }
  });
  std::vector<float> row_sum(rows);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = scores + r * n;
    const float m = row_max[r];
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      sr[t] = vexp(sr[t] - m);
      sum += sr[t];
    }
    row_sum[r] = sum;
  }
  std::fill(out, out + rows * dim, 0.f);
  for_each_token(kv.v, kv, table, n, [&](int64_t t, const T* token) {
    for (int64_t h = h0; h < h1; ++h) {
      const T* value = token + h * kv.head_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = (h - h0) * group + g;
        axpy(out + r * dim, scores[r * n + t], value, dim);
      }
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / row_sum[r];
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] *= inv;
  }
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

}  // namespace

// q [B, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
// int32; context_lens [B] int32 (tokens to attend, including this step's) -> out [B, H, D].
// The G = H / KVH query heads that share a KV head are handled together, so each key and
// value row is read once per (sequence, KV head).
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
  const int64_t max_len = check_tables(tables, lens, batch, k_cache.size(0), block_size);
  const int64_t max_blocks = tables.size(1);
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  auto out = at::empty({batch, num_heads, head_dim}, q.options());
  const int64_t group = num_heads / kv_heads;
  // One work item = one sequence's KV heads [h0, h1): whole sequences when there are enough
  // of them (each block is then read front to back), single heads for small batches.
  const int64_t heads_per_item = batch >= at::get_num_threads() ? kv_heads : 1;
  const int64_t items_per_seq = kv_heads / heads_per_item;
  const int64_t rows = heads_per_item * group;  // query rows of one item
  const float fscale = static_cast<float>(scale);

  dispatch(q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const PagedKv<T> kv{k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_cache.stride(0),
                        k_cache.stride(1), k_cache.stride(2), block_size, head_dim};
    const T* q_ptr = q.data_ptr<T>();
    T* out_ptr = out.data_ptr<T>();
    at::parallel_for(0, batch * items_per_seq, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(rows * max_len), q_rows(rows * head_dim), acc(rows * head_dim);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / items_per_seq;
        const int64_t h0 = item % items_per_seq * heads_per_item;
        for (int64_t r = 0; r < rows; ++r) {  // q rows as float, read once per key
          const T* src = q_ptr + b * q.stride(0) + (h0 * group + r) * q.stride(1);
          for (int64_t d = 0; d < head_dim; ++d) q_rows[r * head_dim + d] = f32(src[d]);
        }
        attend(kv, table_ptr + b * max_blocks, len_ptr[b], h0, h0 + heads_per_item, group,
               q_rows.data(), fscale, scores.data(), acc.data());
        T* dst = out_ptr + (b * num_heads + h0 * group) * head_dim;
        for (int64_t i = 0; i < rows * head_dim; ++i) dst[i] = cast<T>(acc[i]);
      }
    });
  });
  return out;
}

}  // namespace bucketserve
