// Row-wise kernels of the decoder layer: RMSNorm, SwiGLU, rotary embedding + KV store. Inputs
// float32 or bfloat16, math in float32; bfloat16 results are rounded where transformers
// rounds them (see `rounded`). Rows run in parallel on ATen's thread pool.
#include <ATen/Parallel.h>

#include <utility>

#include "common.h"

namespace bucketserve {

namespace {

// Rows per parallel task: small decode batches run inline.
constexpr int64_t kRowGrain = 32;

void check_rows(const at::Tensor& x, const char* name, at::ScalarType like) {
  check_cpu(x, name, like);
  TORCH_CHECK(x.dim() == 2, name, " must be [T, D]");
}

// Rotary embedding (HF rotate_half convention) on heads of x [T, H, D] in place.
template <typename T>
inline void rope_row(T* x, int64_t heads, int64_t head_stride, const T* cos, const T* sin,
                     int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    T* xh = x + h * head_stride;
    for (int64_t d = 0; d < half; ++d) {
      const float a = f32(xh[d]), b = f32(xh[d + half]);
      xh[d] = cast<T>(a * f32(cos[d]) - b * f32(sin[d]));
      xh[d + half] = cast<T>(b * f32(cos[d + half]) + a * f32(sin[d + half]));
    }
  }
}

}  // namespace

// HF LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)), the sum in float32. [T, D] -> [T, D].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x", at::ScalarType::Undefined);
  check_cpu(weight, "weight", x.scalar_type());
  const int64_t rows = x.size(0), dim = x.size(1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim, "weight must be [", dim, "]");
  auto w = weight.contiguous();
  auto out = at::empty({rows, dim}, x.options());
  dispatch(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* x_ptr = x.data_ptr<T>();
    const T* w_ptr = w.data_ptr<T>();
    T* out_ptr = out.data_ptr<T>();
    const int64_t stride = x.stride(0);
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T* xr = x_ptr + t * stride;
        const float inv = 1.f / std::sqrt(dot(xr, xr, dim) / dim + static_cast<float>(eps));
        T* o = out_ptr + t * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = cast<T>(f32(w_ptr[d]) * rounded<T>(f32(xr[d]) * inv));
      }
    });
  });
  return out;
}

// SwiGLU: x [T, 2F] = [gate | up] -> silu(gate) * up [T, F].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_rows(x, "x", at::ScalarType::Undefined);
  TORCH_CHECK(x.size(1) % 2 == 0, "x must be [T, 2F]");
  const int64_t rows = x.size(0), dim = x.size(1) / 2;
  auto out = at::empty({rows, dim}, x.options());
  dispatch(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* x_ptr = x.data_ptr<T>();
    T* out_ptr = out.data_ptr<T>();
    const int64_t stride = x.stride(0);
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T* gate = x_ptr + t * stride;
        const T* up = gate + dim;
        T* o = out_ptr + t * dim;
        for (int64_t d = 0; d < dim; ++d) {
          const float g = f32(gate[d]);
          o[d] = cast<T>(rounded<T>(g / (1.f + vexp(-g))) * f32(up[d]));
        }
      }
    });
  });
  return out;
}

// Rotary embedding on q [T, H, D] and k [T, KVH, D] in place (cos, sin: [T, D] for each
// token's position), then k and v [T, KVH, D] written to the caches [num_blocks, block_size,
// KVH, D] at flat slots (block * block_size + offset). All of one dtype.
void rope_and_store_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const auto dtype = q.scalar_type();
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_cpu(*t, name, dtype);
    TORCH_CHECK(t->dim() == 3, name, " must be [T, heads, D]");
  }
  check_rows(cos, "cos", dtype);
  check_rows(sin, "sin", dtype);
  check_cpu(k_cache, "k_cache", dtype);
  check_cpu(v_cache, "v_cache", dtype);
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
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* q_ptr = q.data_ptr<T>();
    T* k_ptr = k.data_ptr<T>();
    const T* v_ptr = v.data_ptr<T>();
    T* kc = k_cache.data_ptr<T>();
    T* vc = v_cache.data_ptr<T>();
    const int64_t row = kv_heads * dim;  // one token's slot in a cache
    at::parallel_for(0, tokens, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const T* c = cos.data_ptr<T>() + t * cos.stride(0);
        const T* s = sin.data_ptr<T>() + t * sin.stride(0);
        rope_row(q_ptr + t * q.stride(0), q.size(1), q.stride(1), c, s, dim / 2);
        T* kt = k_ptr + t * k.stride(0);
        rope_row(kt, kv_heads, k.stride(1), c, s, dim / 2);
        const T* vt = v_ptr + t * v.stride(0);
        for (int64_t h = 0; h < kv_heads; ++h) {
          std::memcpy(kc + slot_ptr[t] * row + h * dim, kt + h * k.stride(1), dim * sizeof(T));
          std::memcpy(vc + slot_ptr[t] * row + h * dim, vt + h * v.stride(1), dim * sizeof(T));
        }
      }
    });
  });
}

}  // namespace bucketserve
