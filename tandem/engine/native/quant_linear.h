// The operands of a linear layer: the weight formats (a "Lin") and the activations of a few
// rows quantized to int16 (QuantRows); the loops that multiply them are in dot_rows.h,
// dot_rows512.h and linear_rows.h (a few rows) and gemm_tiled.h (many rows).
//
// Weight formats (a "Lin"):
//   kind 0, Q4 groups of 32: q [N, K/32, 16] bytes, element j of a group in the low nibble of
//           byte j, element j + 16 in the high nibble; d, m [N, K/32] fp32; w = d * q + m.
//   kind 1, Q8 per row: q [N, K] int8, d [N] fp32; w = d * q.
//   kind 2, kind 0 with d and m in fp16 (when that is exact, as for GGUF Q4_1 blocks): 17%
//           fewer bytes per weight than kind 0.
//   kind 3, fp32 rows: q [N, K] float (the model's own weight); activations stay fp32.
//   kind 4, Q8 groups of 32: q [N, K] int8, d [N, K/32] fp16; w = d * q (GGUF Q8_0 blocks).
//   kind 5, bf16 rows: q [N, K] bf16 (a bf16 model's own weight), widened in registers (a
//           16-bit shift); activations stay fp32, as for kind 3.
//   kind 6, fp16 rows: q [N, K] fp16 (an fp16 model's own weight), widened with F16C.
//   kind 7, FP8 rows: q [N, K] e4m3 bytes (an FP8 checkpoint's own weight), d its block
//           scales as rows [R, K] (times 256), m [N] int32 the scale row of each weight row;
//           w = e4m3 * scale, widened in registers (fp8_weights.h); activations stay fp32.
// For kinds 0, 1, 2 and 4 the few-row loops quantize activations to int16 in groups of 32 and
// run the products on integers; the tiled GEMM widens the weights to fp32 instead
// (panel_dequant.h). This header also sets the build's ISA switches (TND_AVX512,
// TND_FEW_ROWS_512) that those loops and the GEMM read.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TND_AVX512 1
#else
#define TND_AVX512 0
#endif
#ifndef TND_FEW_ROWS_512  // the 512-bit few-row loops (-DTND_FEW_ROWS_512=0: the AVX2 ones)
#define TND_FEW_ROWS_512 TND_AVX512
#endif

#include <immintrin.h>

#include <cfloat>
#include <cstdint>
#include <vector>

#include "half.h"

namespace tnd {

constexpr int QK = 32;  // quantization group (weights and activations)

struct Lin {
  int32_t kind;  // 0 = Q4 groups, 1 = Q8 rows, 2 = Q4 groups with fp16 d and m, 3 = fp32,
                 // 4 = Q8 groups with fp16 d, 5 = bf16, 6 = fp16, 7 = FP8 (e4m3)
  int32_t n, k;
  const uint8_t* q;
  const float* d;
  const float* m;     // Q4 (kinds 0 and 2; fp16 for kind 2, as d); kind 7: int32 scale rows
  const float* bias;  // may be null
};

// Kinds whose weights are floats (fp32, bf16, fp16, FP8): activations stay fp32, nothing is
// quantized.
constexpr bool float_kind(int kind) { return kind == 3 || kind == 5 || kind == 6 || kind == 7; }

// Weight type of a float kind.
template <int Kind> struct FloatWeight { using T = float; };
template <> struct FloatWeight<5> { using T = bf16; };
template <> struct FloatWeight<6> { using T = f16; };

// Scale of group i of a Q4 matrix (fp32, or fp16 for kind 2).
template <int Kind>
inline float q4_param(const float* p, size_t i) {
  return Kind == 2 ? _cvtsh_ss(reinterpret_cast<const uint16_t*>(p)[i]) : p[i];
}

// Activations of R rows quantized to int16 in groups of 32: values, scale, scale * sum(q).
// int16 keeps activation rounding (~2e-5 relative) far below the weights' own; int8 ones
// (llama.cpp's choice) cost SmolLM2 +0.6% perplexity on the fixed text, measured.
// Layout of a row's values: groups in order, 32 each; for the Q4 kinds in the 512-bit build
// (paired_kind), in steps of two or more rows, each pair of groups (2p, 2p + 1) instead
// interleaves its halves, [2p: 0..15, 2p+1: 0..15, 2p: 16..31, 2p+1: 16..31], so one register
// meets both groups' low (or high) nibbles (a last unpaired group stays as it is).
constexpr bool paired_kind(int kind) { return TND_FEW_ROWS_512 && (kind == 0 || kind == 2); }

inline int quant_slot(int b, int j, int g, bool paired) {
  if (paired && (b | 1) < g) return (b & ~1) * QK + (j / 16) * 32 + (b & 1) * 16 + j % 16;
  return b * QK + j;
}

// One group of 32 activations to int16: lo gets elements 0..15, hi 16..31; d the scale
// (max |x| / 32767), s the scale times the sum of the codes. Rounds to nearest even (the
// MXCSR default, as std::nearbyint did in the scalar loop this replaces: the same codes).
inline void quantize_group(const float* xb, int16_t* lo, int16_t* hi, float& d, float& s) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float scale = _mm_cvtss_f32(h) / 32767.f;
  // a scale below the normal range (|x| < 4e-34) would make 1 / scale infinite: codes 0
  const __m256 inv = _mm256_set1_ps(scale >= FLT_MIN ? 1.f / scale : 0.f);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
  // packs interleaves 128-bit lanes; the permute puts the 16 codes back in order
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo),
                      _mm256_permute4x64_epi64(_mm256_packs_epi32(c[0], c[1]), 0xD8));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi),
                      _mm256_permute4x64_epi64(_mm256_packs_epi32(c[2], c[3]), 0xD8));
  const __m256i t = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
  d = scale;
  s = scale * static_cast<float>(_mm_cvtsi128_si32(u));
}

struct QuantRows {
  std::vector<int16_t> q;
  std::vector<float> d, s;
  int k = 0;
  void quantize(const float* x, int rows, int k_, bool paired = false) {
    k = k_;
    const int g = k / QK;
    q.resize(static_cast<size_t>(rows) * k);
    d.resize(static_cast<size_t>(rows) * g);
    s.resize(static_cast<size_t>(rows) * g);
    for (int r = 0; r < rows; ++r) {
      int16_t* qr = q.data() + static_cast<size_t>(r) * k;
      for (int b = 0; b < g; ++b) {
        const size_t i = static_cast<size_t>(r) * g + b;
        quantize_group(x + static_cast<size_t>(r) * k + b * QK, qr + quant_slot(b, 0, g, paired),
                       qr + quant_slot(b, 16, g, paired), d[i], s[i]);
      }
    }
  }
};

}  // namespace tnd
