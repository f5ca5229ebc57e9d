// The engine's CPU kernels as torch.ops.bucketserve.*: paged attention for decode
// (paged_attention.cpp), fused RMSNorm, rotary embedding + KV store and SwiGLU
// (elementwise.cpp), and every decoder layer of a decode step in one call
// (decode_layers.cpp), and linears of a few rows (small_linear.cpp: bf16 on AVX512-BF16 CPUs,
// float32 and bf16 on AVX2 CPUs without AVX-512).
// float32 or bfloat16 tensors, float32 math; every op parallelises over
// rows with ATen's thread pool (torch.set_num_threads applies).
#include <torch/library.h>

#include "kernels.h"

TORCH_LIBRARY(bucketserve, m) {
  m.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rope_and_store_kv(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor cos, Tensor sin, "
        "Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping) -> ()");
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("small_linear_rows(ScalarType dtype) -> int", &bucketserve::small_linear_rows);
  m.def("decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor[] weights, Tensor(a!) pool, "
        "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, int num_heads, "
        "int num_kv_heads, float eps, float scale, int gemm_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(bucketserve, CPU, m) {
  m.impl("paged_attention_decode", &bucketserve::paged_attention_decode);
  m.impl("rms_norm", &bucketserve::rms_norm);
  m.impl("silu_and_mul", &bucketserve::silu_and_mul);
  m.impl("rope_and_store_kv", &bucketserve::rope_and_store_kv);
  m.impl("decode_layers", &bucketserve::decode_layers);
  m.impl("small_linear", &bucketserve::small_linear);
}

// decode_layers' weight list holds oneDNN-packed tensors, which dispatch as MkldnnCPU.
TORCH_LIBRARY_IMPL(bucketserve, MkldnnCPU, m) {
  m.impl("decode_layers", &bucketserve::decode_layers);
}
