// FP8 weights (kind 7 of quant_linear.h): a checkpoint's e4m3 bytes, one per weight, widened
// to fp32 in registers and multiplied by their block's scale, in the few-row loop
// (dot_rows_fp8, fp32 activations as for the float kinds) and in the tiled GEMM's panels
// (dequant_fp8).
//
//   q  [N, K] e4m3 bytes (float8_e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits)
//   d  [R, K] fp32 scale rows: row r holds, for every input k, the scale of block (r, k / bk)
//      times 256 (a per-tensor scale is one row of one value)
//   m  [N] int32 (through Lin's float pointer): the scale row of each weight row, so a fused
//      layer's parts (q/k/v, gate/up) keep their own blocks and scales
//   w[n, k] = e4m3(q[n, k]) * d[m[n], k] / 256
//
// Any K: the loops run whole steps of 32 (16) inputs and widen a row's last K % 32 from a
// zero-padded copy, so a checkpoint linear of any width stays one byte a weight.
//
// Widening (e4m3.h): each byte becomes the fp16 code of its value times 2^-8, widened exactly
// by F16C. The 2^8 lives in the scale rows (exact: a power of two), so each weight is e4m3 *
// scale rounded once to fp32, the float the torch path's dequantization computes. The two NaN
// codes (0x7F, 0xFF) would read as +-480 * scale: packed_linear.py refuses them.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "e4m3.h"
#include "quant_linear.h"
#include "vec_math.h"

namespace tnd {

constexpr int KIND_FP8 = 7;

// Bytes of q ahead of the one being read that a weight row's loop prefetches.
constexpr int FP8_PREFETCH_BYTES = 512;

// Weights p[0..16) times their scale rows' s[0..16): two vectors of 8 floats.
inline void fp8_load16(const uint8_t* p, const float* s, __m256& lo, __m256& hi) {
  const __m256i h = e4m3_to_f16_bits(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(s));
  hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_loadu_ps(s + 8));
}

#if TND_FEW_ROWS_512
// The same, 16 weights in one 512-bit register.
inline __m512 fp8_load16_512(const uint8_t* p, const float* s) {
  const __m256i h = e4m3_to_f16_bits(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_loadu_ps(s));
}
#endif

// The scale row (times 256) of weight row n.
inline const float* fp8_scales(const Lin& w, int n) {
  const int32_t row = reinterpret_cast<const int32_t*>(w.m)[n];
  return w.d + static_cast<size_t>(row) * w.k;
}

// One step of 32 inputs for R activation rows: weights p[0..32) scaled by s[0..32), times
// x[i][0..32), into each row's accumulators (two 512-bit ones a row, or four 256-bit ones).
#if TND_FEW_ROWS_512
using Fp8Acc = __m512[2];
#else
using Fp8Acc = __m256[4];
#endif

template <int R>
[[gnu::always_inline]] inline void fp8_step32(const uint8_t* p, const float* s,
                                               const float* const* x, Fp8Acc* acc) {
#if TND_FEW_ROWS_512
  const __m512 w0 = fp8_load16_512(p, s), w1 = fp8_load16_512(p + 16, s + 16);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    acc[i][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[i]), acc[i][0]);
    acc[i][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[i] + 16), acc[i][1]);
  }
#else
  __m256 wv[4];
  fp8_load16(p, s, wv[0], wv[1]);
  fp8_load16(p + 16, s + 16, wv[2], wv[3]);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    for (int u = 0; u < 4; ++u) {
      acc[i][u] = _mm256_fmadd_ps(wv[u], _mm256_loadu_ps(x[i] + 8 * u), acc[i][u]);
    }
  }
#endif
}

// out[i] = w[n] . x[r0 + i] for i < R (1-4 fp32 activation rows, `ldx` floats apart), for any
// K: 32 weights a step, four independent FMA chains a row (two in the 512-bit build), as
// dot_rows_f32 does for the float kinds. A K that is not a multiple of 32 ends in one more
// step over copies of its last K % 32 weights, scales and activations padded with zeros
// (zero weights under zero scales add +0 to every product): the hot loop stays as it is and
// nothing reads past a row.
template <int R>
inline void dot_rows_fp8(const Lin& w, int n, const float* x, int ldx, int r0, float* out) {
  const uint8_t* wr = w.q + static_cast<size_t>(n) * w.k;
  const float* s = fp8_scales(w, n);
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + static_cast<size_t>(r0 + i) * ldx;
  Fp8Acc acc[R];
  for (int i = 0; i < R; ++i) {
#if TND_FEW_ROWS_512
    acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#else
    for (int u = 0; u < 4; ++u) acc[i][u] = _mm256_setzero_ps();
#endif
  }
  const int whole = w.k & ~(QK - 1);
  for (int j = 0; j < whole; j += QK) {
    _mm_prefetch(reinterpret_cast<const char*>(wr + j + FP8_PREFETCH_BYTES), _MM_HINT_T0);
    const float* xj[R];
    for (int i = 0; i < R; ++i) xj[i] = xr[i] + j;
    fp8_step32<R>(wr + j, s + j, xj, acc);
  }
  if (const int tail = w.k - whole; tail > 0) {
    alignas(64) uint8_t qt[QK] = {};
    alignas(64) float st[QK] = {};
    alignas(64) float xt[R][QK] = {};
    std::memcpy(qt, wr + whole, tail);
    std::memcpy(st, s + whole, tail * sizeof(float));
    const float* xj[R];
    for (int i = 0; i < R; ++i) {
      std::memcpy(xt[i], xr[i] + whole, tail * sizeof(float));
      xj[i] = xt[i];
    }
    fp8_step32<R>(qt, st, xj, acc);
  }
#if TND_FEW_ROWS_512
  for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
#else
  for (int i = 0; i < R; ++i) {
    out[i] = hsum(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]),
                                _mm256_add_ps(acc[i][2], acc[i][3])));
  }
#endif
}

// 16 weights of row n from input j (j + 16 <= K) as floats in dst.
inline void fp8_store16(const uint8_t* wr, const float* s, int j, float* dst) {
#if TND_FEW_ROWS_512
  _mm512_storeu_ps(dst, fp8_load16_512(wr + j, s + j));
#else
  __m256 lo, hi;
  fp8_load16(wr + j, s + j, lo, hi);
  _mm256_storeu_ps(dst, lo);
  _mm256_storeu_ps(dst + 8, hi);
#endif
}

// Inputs [k0, k1) of weight row n as floats in dst (k0 a multiple of 16; k1 <= K, any): the
// tiled GEMM's panels and the embedding rows of lin_row. A last partial 16 is widened from a
// zero-padded copy and only its k1 - k0 values written.
inline void dequant_fp8(const Lin& w, int n, int k0, int k1, float* dst) {
  const uint8_t* wr = w.q + static_cast<size_t>(n) * w.k;
  const float* s = fp8_scales(w, n);
  int j = k0;
  for (; j + 16 <= k1; j += 16) fp8_store16(wr, s, j, dst + (j - k0));
  if (const int tail = k1 - j; tail > 0) {
    alignas(64) uint8_t qt[16] = {};
    alignas(64) float st[16] = {};
    alignas(64) float out[16];
    std::memcpy(qt, wr + j, tail);
    std::memcpy(st, s + j, tail * sizeof(float));
    fp8_store16(qt, st, 0, out);
    std::memcpy(dst + (j - k0), out, tail * sizeof(float));
  }
}

}  // namespace tnd
