// Row operations of the decoder layers (decode_step.cpp's attention and mla_attention.h):
// RMSNorm and the two RoPE layouts, each on one vector, numerics as the torch path's
// (engine/models/layers/norm.py, rotary.py) in fp32.
//
// Included after the kernels' headers (paged_attention.h, gemm_tiled.h, ...): nothing here is
// a hot loop, and defining it last leaves the order of their definitions, which steers GCC's
// inlining of the micro-kernels, as decode_step.cpp describes.
#pragma once

#include <cmath>

namespace tnd {

// out = weight * (x * rsqrt(mean(x^2) + eps)), one row of length n (out may be x).
inline void rms_norm(const float* x, const float* weight, float eps, int n, float* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

// x * cos + rotate_half(x) * sin, in place, one head vector (the half-split layout of
// Hugging Face checkpoints).
inline void rope(float* x, const float* cos, const float* sin, int hd) {
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// DeepSeek's RoPE on adjacent pairs (x0, x1), (x2, x3), ..., pair i turned by angle i (the
// tables' first half), in place; the result lists the pairs' first elements, then their
// second ones, as rotary.py's apply_rotary_interleaved does (the latent cache holds k_pe in
// that order, whichever path wrote it). d <= 2 * MAX_ROPE_PAIRS.
constexpr int MAX_ROPE_PAIRS = 256;
inline void rope_interleaved(float* x, const float* cos, const float* sin, int d) {
  const int half = d / 2;
  float t[2 * MAX_ROPE_PAIRS];
  for (int i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    t[i] = a * cos[i] - b * sin[i];
    t[half + i] = b * cos[i] + a * sin[i];
  }
  for (int i = 0; i < d; ++i) x[i] = t[i];
}

}  // namespace tnd
