// Every decoder layer of a decode-only step in one call: the same kernels and oneDNN GEMMs the
// Python layers run (engine/model.py with engine/fusion.py's CPU classes), in the same order on
// the same shapes, so the results are bit-identical; what it removes is the ~15 Python module
// calls and tensor ops per layer, which at batch 1 cost as much as a third of the step.
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>

#include "common.h"
#include "kernels.h"

namespace bucketserve {

namespace {

constexpr int64_t kWeightsPerLayer = 11;  // see decode_layers

// torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], None): OneDnnLinear.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  std::optional<at::Tensor> b;
  if (bias.defined() && bias.numel()) b = bias;
  return op.call(x, packed, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// OneDnnLinear._gemm for one step: a step of at most small_linear_rows rows whose layer kept
// its plain weight runs small_linear; otherwise inputs are padded with zero rows to
// `gemm_rows` (one of the shapes warm_onednn ran) for oneDNN, outputs cut back to the step's
// rows. One zeroed buffer per input width serves every layer: only its first rows are written.
// A packed weight of another dtype than x (float32 for bf16 on CPUs without oneDNN bf16
// GEMMs: fusion.gemm_dtype) gets x and the bias in its dtype and gives back x's.
class StepLinears {
 public:
  StepLinears(int64_t rows, int64_t gemm_rows) : rows_(rows), gemm_rows_(gemm_rows) {}

  at::Tensor operator()(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& plain,
                        const at::Tensor& bias = at::Tensor()) {
    if (plain.numel() && rows_ <= small_linear_rows(plain.scalar_type())) {
      std::optional<at::Tensor> b;
      if (bias.defined() && bias.numel()) b = bias;
      return small_linear(x.contiguous(), plain, b);
    }
    const auto gemm_dtype = packed.scalar_type();
    const at::Tensor gemm_bias =
        bias.defined() && bias.numel() ? bias.to(gemm_dtype) : at::Tensor();
    at::Tensor out;
    if (rows_ == gemm_rows_) {
      out = onednn_linear(x.to(gemm_dtype), packed, gemm_bias);
    } else {
      auto [it, fresh] = padded_.try_emplace(x.size(1));
      if (fresh) it->second = at::zeros({gemm_rows_, x.size(1)}, x.options().dtype(gemm_dtype));
      it->second.narrow(0, 0, rows_).copy_(x);
      out = onednn_linear(it->second, packed, gemm_bias).narrow(0, 0, rows_);
    }
    return out.to(x.scalar_type());
  }

 private:
  int64_t rows_, gemm_rows_;
  std::map<int64_t, at::Tensor> padded_;  // input width -> [gemm_rows, width]
};

}  // namespace

// x [B, D]: the step's hidden states after the embedding, one row per decode sequence;
// cos, sin [B, head_dim] (x's dtype); weights: per layer, in order, input_layernorm.weight,
// qkv_proj packed weight, qkv_proj bias (an empty tensor: none), o_proj packed weight,
// post_attention_layernorm.weight, gate_up_proj packed weight, down_proj packed weight, then
// the plain weights of qkv_proj, o_proj, gate_up_proj and down_proj for small_linear
// (empty tensors: none, every step runs oneDNN); pool
// [L, 2, N, block_size, KVH, head_dim]; slot_mapping, block_tables, context_lens as
// rope_and_store_kv and paged_attention_decode take them. -> hidden [B, D] before the final norm.
at::Tensor decode_layers(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                         at::TensorList weights, const at::Tensor& pool,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens, int64_t num_heads, int64_t num_kv_heads,
                         double eps, double scale, int64_t gemm_rows) {
  TORCH_CHECK(x_in.dim() == 2, "x must be [B, D]");
  TORCH_CHECK(pool.dim() == 6 && pool.size(1) == 2, "pool must be [L, 2, N, bs, KVH, hd]");
  const int64_t layers = pool.size(0), rows = x_in.size(0), head_dim = pool.size(5);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer,
              "weights must hold ", kWeightsPerLayer, " tensors per layer (", layers,
              " layers), got ", weights.size());
  TORCH_CHECK(gemm_rows >= rows, "gemm_rows (", gemm_rows, ") < rows (", rows, ")");
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  StepLinears linear(rows, gemm_rows);
  at::Tensor x = x_in;
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + i * kWeightsPerLayer;
    const at::Tensor k_cache = pool.select(0, i).select(0, 0);
    const at::Tensor v_cache = pool.select(0, i).select(0, 1);
    // Attention: fused qkv, rotary + KV store in place, paged attention, o_proj.
    const at::Tensor qkv = linear(rms_norm(x, w[0], eps), w[1], w[7], w[2]);
    const at::Tensor q = qkv.narrow(1, 0, q_size).view({rows, num_heads, head_dim});
    const at::Tensor k = qkv.narrow(1, q_size, kv_size).view({rows, num_kv_heads, head_dim});
    const at::Tensor v =
        qkv.narrow(1, q_size + kv_size, kv_size).view({rows, num_kv_heads, head_dim});
    rope_and_store_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping);
    const at::Tensor attn =
        paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale);
    const at::Tensor h = x + linear(attn.reshape({rows, -1}), w[3], w[8]);
    // MLP: fused gate/up, SwiGLU, down_proj.
    const at::Tensor gate_up = linear(rms_norm(h, w[4], eps), w[5], w[9]);
    x = h + linear(silu_and_mul(gate_up), w[6], w[10]);
  }
  return x;
}

}  // namespace bucketserve
