// The kernels' entry points, registered as torch.ops.bucketserve.* by cpu_ops.cpp and called
// directly by decode_layers.cpp.
#pragma once

#include <ATen/ATen.h>

namespace bucketserve {

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
void rope_and_store_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping);
constexpr int64_t kGemvRows = 4;      // small_linear's streaming loops: 1..4 rows
constexpr int64_t kBlockedRows = 16;  // its blocked loop (bf16 on AVX2 CPUs): up to 16 rows
// The most rows small_linear takes in `dtype` on this CPU (0: it does not run `dtype`).
int64_t small_linear_rows(at::ScalarType dtype);
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias);
at::Tensor decode_layers(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         at::TensorList weights, const at::Tensor& pool,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens, int64_t num_heads, int64_t num_kv_heads,
                         double eps, double scale, int64_t gemm_rows);

}  // namespace bucketserve
