// Shared helpers of the CPU kernels: element types (float32 and bfloat16, always computed in
// float32), the vectorisable math the kernels share, and argument checks.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace bucketserve {

using bf16 = c10::BFloat16;

inline float f32(float x) { return x; }
inline float f32(bf16 x) { return static_cast<float>(x); }

// float -> T (bfloat16: round to nearest even, as torch's .to(torch.bfloat16)).
template <typename T>
inline T cast(float x) {
  return static_cast<T>(x);
}

// x rounded to T's precision: where transformers rounds an intermediate bf16 result (RMSNorm's
// normalised x, SwiGLU's silu(gate)), the kernels round it too; float32: x unchanged.
template <typename T>
inline float rounded(float x) {
  return f32(cast<T>(x));
}

// Built with -fassociative-math: the compiler may reorder these sums into vector lanes.
template <typename A, typename B>
inline float dot(const A* a, const B* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += f32(a[i]) * f32(b[i]);
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

// A CPU tensor of dtype `like` (float32 or bfloat16; `like` undefined: either), contiguous in
// its last dimension.
inline void check_cpu(const at::Tensor& t, const char* name, at::ScalarType like) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(like == at::ScalarType::Undefined || dtype == like, name, " must be ", like,
              " like the other inputs, got ", dtype);
  TORCH_CHECK(t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

inline void check_cpu(const at::Tensor& t, const char* name) {
  check_cpu(t, name, at::ScalarType::Undefined);
}

// fn(T{}) for T = float or bf16 by dtype (checked before): fn is a generic lambda that reads
// its element type as decltype(tag).
template <typename Fn>
inline auto dispatch(at::ScalarType dtype, Fn fn) {
  if (dtype == at::kBFloat16) return fn(bf16{});
  return fn(float{});
}

}  // namespace bucketserve
