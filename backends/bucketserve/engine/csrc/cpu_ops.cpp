// CPU kernels for the decode step: paged attention that reads the KV pool through the block
// tables (no gather), plus fused RMSNorm, rotary embedding and SwiGLU. float32 only; every op
// parallelises over rows with ATen's thread pool (torch.set_num_threads applies).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// Built with -fassociative-math: the compiler may reorder these sums into vector lanes.
inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// exp(x) by Cephes' expf polynomial (about 2 ulp), written so the compiler vectorises the
// calling loop (std::exp stays scalar). x is clamped to [-87, 88]: 2^n stays a normal float.
inline float vexp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// A layer's paged K/V caches: [num_blocks, block_size, KVH, D] with shared strides.
struct PagedKv {
  const float* k;
  const float* v;
  int64_t block_stride, token_stride, head_stride, block_size, head_dim;
};

// Calls fn(t, row) for each of a sequence's n cached tokens in order, where row points at
// token t's first head in `cache` (kv.k or kv.v), walking the block table block by block.
template <typename Fn>
inline void for_each_token(const float* cache, const PagedKv& kv, const int32_t* table,
                           int64_t n, Fn fn) {
  const int64_t bs = kv.block_size;
  for (int64_t i = 0, start = 0; start < n; ++i, start += bs) {
    const float* block = cache + table[i] * kv.block_stride;
    for (int64_t t = start; t < std::min(n, start + bs); ++t) {
      fn(t, block + (t - start) * kv.token_stride);
    }
  }
}

// Attention of query heads [h0 * G, h1 * G) of one sequence over its n cached tokens.
// q: that sequence's [H, D] rows (row stride q_stride); out: its [H, D] output rows;
// scores: room for (h1 - h0) * G * n floats.
void attend(const PagedKv& kv, const int32_t* table, int64_t n, int64_t h0, int64_t h1,
            int64_t group, const float* q, int64_t q_stride, float scale, float* scores,
            float* out) {
  const int64_t rows = (h1 - h0) * group, dim = kv.head_dim;
  std::vector<float> row_max(rows, -std::numeric_limits<float>::infinity());
  for_each_token(kv.k, kv, table, n, [&](int64_t t, const float* token) {
    for (int64_t h = h0; h < h1; ++h) {
      const float* key = token + h * kv.head_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = (h - h0) * group + g;
        const float s = dot(q + (h * group + g) * q_stride, key, dim) * scale;
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
  float* out_rows = out + h0 * group * dim;
  std::fill(out_rows, out_rows + rows * dim, 0.f);
  for_each_token(kv.v, kv, table, n, [&](int64_t t, const float* token) {
    for (int64_t h = h0; h < h1; ++h) {
      const float* value = token + h * kv.head_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = (h - h0) * group + g;
        axpy(out_rows + r * dim, scores[r * n + t], value, dim);
      }
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / row_sum[r];
    for (int64_t d = 0; d < dim; ++d) out_rows[r * dim + d] *= inv;
  }
}

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

// Rows per parallel task for the row-wise ops below: small decode batches run inline.
constexpr int64_t kRowGrain = 32;

void check_rows(const at::Tensor& x, const char* name) {
  check_float_cpu(x, name);
  TORCH_CHECK(x.dim() == 2, name, " must be [T, D]");
}

// HF LlamaRMSNorm in float32: weight * (x * rsqrt(mean(x^2) + eps)). x [T, D] -> [T, D].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_float_cpu(weight, "weight");
  const int64_t rows = x.size(0), dim = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim, "weight must be [", dim, "]");
  auto w = weight.contiguous();
  auto out = at::empty({rows, dim}, x.options());
  const float* x_ptr = x.data_ptr<float>();
  const float* w_ptr = w.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = x_ptr + t * stride;
      const float inv = 1.f / std::sqrt(dot(xr, xr, dim) / dim + static_cast<float>(eps));
      float* o = out_ptr + t * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = w_ptr[d] * (xr[d] * inv);
    }
  });
  return out;
}

// SwiGLU: x [T, 2F] = [gate | up] -> silu(gate) * up [T, F].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "x");
  TORCH_CHECK(x.size(1) % 2 == 0, "x must be [T, 2F]");
  const int64_t rows = x.size(0), dim = x.size(1) / 2;
  auto out = at::empty({rows, dim}, x.options());
  const float* x_ptr = x.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = x_ptr + t * stride;
      const float* up = gate + dim;
      float* o = out_ptr + t * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = gate[d] / (1.f + vexp(-gate[d])) * up[d];
    }
  });
  return out;
}

// Rotary embedding (HF rotate_half convention) on heads of x [T, H, D] in place.
inline void rope_row(float* x, int64_t heads, int64_t head_stride, const float* cos,
                     const float* sin, int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * head_stride;
    for (int64_t d = 0; d < half; ++d) {
      const float a = xh[d], b = xh[d + half];
      xh[d] = a * cos[d] - b * sin[d];
      xh[d + half] = b * cos[d + half] + a * sin[d + half];
    }
  }
}

// Rotary embedding on q [T, H, D] and k [T, KVH, D] in place (cos, sin: [T, D] for each
// token's position), then k and v [T, KVH, D] written to the caches [num_blocks, block_size,
// KVH, D] at flat slots (block * block_size + offset).
void rope_and_store_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_float_cpu(*t, name);
    TORCH_CHECK(t->dim() == 3, name, " must be [T, heads, D]");
  }
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  check_float_cpu(k_cache, "k_cache");
  check_float_cpu(v_cache, "v_cache");
  const int64_t tokens = q.size(0), dim = q.size(2), kv_heads = k.size(1);
  TORCH_CHECK(dim % 2 == 0 && cos.size(1) == dim && sin.sizes() == cos.sizes() &&
                  cos.size(0) == tokens && k.size(0) == tokens && v.sizes() == k.sizes(),
              "q, k, v, cos and sin disagree on tokens or head_dim");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == kv_heads &&
                  k_cache.size(3) == dim,
              "caches must be contiguous [num_blocks, block_size, KVH, D]");
  auto slots = slot_mapping.to(at::kLong).contiguous();
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == tokens, "slot_mapping must be [T]");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slot_ptr[t] >= 0 && slot_ptr[t] < num_slots, "slot_mapping[", t, "] = ",
                slot_ptr[t], " is outside the cache's ", num_slots, " slots");
  }
  float* q_ptr = q.data_ptr<float>();
  float* k_ptr = k.data_ptr<float>();
  const float* v_ptr = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t row = kv_heads * dim;  // one token's slot in a cache
  at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos.data_ptr<float>() + t * cos.stride(0);
      const float* s = sin.data_ptr<float>() + t * sin.stride(0);
      rope_row(q_ptr + t * q.stride(0), q.size(1), q.stride(1), c, s, dim / 2);
      float* kt = k_ptr + t * k.stride(0);
      rope_row(kt, kv_heads, k.stride(1), c, s, dim / 2);
      const float* vt = v_ptr + t * v.stride(0);
      for (int64_t h = 0; h < kv_heads; ++h) {
        std::memcpy(kc + slot_ptr[t] * row + h * dim, kt + h * k.stride(1), dim * sizeof(float));
        std::memcpy(vc + slot_ptr[t] * row + h * dim, vt + h * v.stride(1), dim * sizeof(float));
      }
    }
  });
}

// q [B, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]; block_tables [B, max_blocks]
// int32; context_lens [B] int32 (tokens to attend, including this step's) -> out [B, H, D].
// The G = H / KVH query heads that share a KV head are handled together, so each key and
// value row is read once per (sequence, KV head).
at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale) {
  check_float_cpu(q, "q");
  check_float_cpu(k_cache, "k_cache");
  check_float_cpu(v_cache, "v_cache");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q must be [B, H, D] and the caches [num_blocks, block_size, KVH, D]");
  TORCH_CHECK(k_cache.stride(0) == v_cache.stride(0) && k_cache.stride(1) == v_cache.stride(1) &&
                  k_cache.stride(2) == v_cache.stride(2),
              "k_cache and v_cache must share one layout");
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_blocks = k_cache.size(0), block_size = k_cache.size(1);
  const int64_t kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim, "head_dim of q and the caches differ");
  TORCH_CHECK(num_heads % kv_heads == 0, "num_heads must be a multiple of the KV heads");
  auto tables = block_tables.to(at::kInt).contiguous();
  auto lens = context_lens.to(at::kInt).contiguous();
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

  auto out = at::empty({batch, num_heads, head_dim}, q.options());
  const PagedKv kv{k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), k_cache.stride(0),
                   k_cache.stride(1), k_cache.stride(2), block_size, head_dim};
  const int64_t group = num_heads / kv_heads;
  // One work item = one sequence's KV heads [h0, h1): whole sequences when there are enough
  // of them (each block is then read front to back), single heads for small batches.
  const int64_t heads_per_item = batch >= at::get_num_threads() ? kv_heads : 1;
  const int64_t items_per_seq = kv_heads / heads_per_item;
  const float* q_ptr = q.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * items_per_seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(heads_per_item * group * max_len);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / items_per_seq;
      const int64_t h0 = item % items_per_seq * heads_per_item;
      attend(kv, table_ptr + b * max_blocks, len_ptr[b], h0, h0 + heads_per_item, group,
             q_ptr + b * q.stride(0), q.stride(1), fscale, scores.data(),
             out_ptr + b * num_heads * head_dim);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(bucketserve, m) {
  m.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rope_and_store_kv(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor cos, Tensor sin, "
        "Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(bucketserve, CPU, m) {
  m.impl("paged_attention_decode", &paged_attention_decode);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rope_and_store_kv", &rope_and_store_kv);
}
