// The tiled path's weight panel: 16 weight rows x one window of inputs as fp32, laid out
// [k][16] (one 16-wide row per input) for gemm_tiled.h's micro-kernel.
//
// Q4 groups (kinds 0 and 2) go straight from their bytes to the panel: load two adjacent
// groups of each of the 16 weight rows (32 bytes a row), transpose those 16 x 16 bytes in
// each 128-bit lane (64 byte shuffles for 1024 weights), and every transposed register then
// holds one byte (two inputs' nibbles) of all 16 rows: mask or shift, widen, convert,
// fma(d, q, m), store two panel rows. In L1 that takes ~0.65x the time of widening each weight
// row to floats and then transposing the floats in 8 x 8 blocks (dequant_groups + transpose8:
// the other kinds, a partial panel of fewer than 16 rows and a window's odd last Q4 group);
// for Q8 the two measured the same, so Q8 keeps the by-rows path. Every panel value is the
// same float either way, fma(d, q, m) in the same rounding.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "fp8_weights.h"
#include "quant_linear.h"

namespace tnd {

constexpr int PANEL_N = 16;   // weight rows per panel (two vectors of outputs)
constexpr int PANEL_K = 256;  // inputs per panel: 16 KB of floats, in L1

// Groups [g0, g1) of weight row n as floats in dst (kind 3: copied; kinds 5 and 6: widened).
// FP8 rows (any K) go through dequant_fp8 instead (dequant_inputs).
template <int Kind>
inline void dequant_groups(const Lin& w, int n, int g0, int g1, float* dst) {
  static_assert(Kind != KIND_FP8, "FP8 rows: dequant_fp8");
  if constexpr (Kind == 3) {
    const float* src = reinterpret_cast<const float*>(w.q) + static_cast<size_t>(n) * w.k;
    std::copy(src + g0 * QK, src + g1 * QK, dst);
  } else if constexpr (Kind == 5 || Kind == 6) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(w.q) + static_cast<size_t>(n) * w.k;
    for (int j = g0 * QK; j < g1 * QK; j += 8) {
      _mm256_storeu_ps(dst + (j - g0 * QK), Kind == 5 ? load8_bf16(src + j) : load8_f16(src + j));
    }
  } else {
    const int g = w.k / QK;
    const size_t row_groups = static_cast<size_t>(n) * g;
    for (int b = g0; b < g1; ++b) {
      float* o = dst + (b - g0) * QK;
      if constexpr (Kind == 0 || Kind == 2) {
        const uint8_t* qs = w.q + row_groups * 16;
        const __m256 d = _mm256_set1_ps(q4_param<Kind>(w.d, row_groups + b));
        const __m256 m = _mm256_set1_ps(q4_param<Kind>(w.m, row_groups + b));
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16));
        const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m));
        _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m));
        _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m));
      } else {
        const int8_t* q = reinterpret_cast<const int8_t*>(w.q) + static_cast<size_t>(n) * w.k;
        const uint16_t* d16 = reinterpret_cast<const uint16_t*>(w.d);
        const __m256 d = _mm256_set1_ps(Kind == 1 ? w.d[n] : _cvtsh_ss(d16[row_groups + b]));
        for (int j = 0; j < QK; j += 8) {
          const __m256i v = _mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + b * QK + j)));
          _mm256_storeu_ps(o + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
        }
      }
    }
  }
}

// Inputs [k0, k1) of weight row n as floats in dst: whole groups of 32 for the grouped and
// float kinds, any range of an FP8 row (its K need not be a multiple of 32).
template <int Kind>
inline void dequant_inputs(const Lin& w, int n, int k0, int k1, float* dst) {
  if constexpr (Kind == KIND_FP8) {
    dequant_fp8(w, n, k0, k1, dst);
  } else {
    dequant_groups<Kind>(w, n, k0 / QK, k1 / QK, dst);
  }
}

// 8x8 transpose: rows r[0..8) (8 floats each, `ld` apart) -> columns, written to dst rows
// (`ldd` apart).
inline void transpose8(const float* src, int ld, float* dst, int ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + static_cast<size_t>(i) * ld);
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  u[0] = _mm256_shuffle_ps(t[0], t[2], 0x44);
  u[1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
  u[2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
  u[3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
  u[4] = _mm256_shuffle_ps(t[4], t[6], 0x44);
  u[5] = _mm256_shuffle_ps(t[4], t[6], 0xEE);
  u[6] = _mm256_shuffle_ps(t[5], t[7], 0x44);
  u[7] = _mm256_shuffle_ps(t[5], t[7], 0xEE);
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + static_cast<size_t>(i) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + static_cast<size_t>(i + 4) * ldd,
                     _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

// Inputs [k0, k0 + kc) of weight rows n0 .. n0 + nr (nr <= 16; missing rows are zeros) into
// panel[k - k0][16], by way of `rowbuf` (16 rows of PANEL_K floats). kc is a multiple of 32
// but for an FP8 row's last window; the transposes then run to the next multiple of 8 over
// zeros, and panel rows past kc are never read (the micro-kernels stop at kc).
template <int Kind>
inline void panel_by_rows(const Lin& w, int n0, int nr, int k0, int kc, float* rowbuf,
                          float* panel) {
  const int kc8 = (kc + 7) & ~7;
  for (int j = 0; j < PANEL_N; ++j) {
    float* dst = rowbuf + j * PANEL_K;
    if (j < nr) {
      dequant_inputs<Kind>(w, n0 + j, k0, k0 + kc, dst);
      std::fill(dst + kc, dst + kc8, 0.f);
    } else {
      std::fill(dst, dst + kc8, 0.f);
    }
  }
  for (int kk = 0; kk < kc8; kk += 8) {
    transpose8(rowbuf + kk, PANEL_K, panel + kk * PANEL_N, PANEL_N);
    transpose8(rowbuf + 8 * PANEL_K + kk, PANEL_K, panel + kk * PANEL_N + 8, PANEL_N);
  }
}

// In each 128-bit lane, r[16] as a 16 x 16 byte matrix, transposed in place: afterwards byte
// j of r[i] is what byte i of r[j] was (both lanes alike). Four rounds of unpacks, each
// pairing elements twice as wide as the last.
inline void transpose16_bytes(__m256i* r) {
  __m256i a[16], b[16], c[16];
  for (int p = 0; p < 8; ++p) {  // a[2p], a[2p + 1]: bytes 0-7, 8-15 of rows 2p, 2p + 1
    a[2 * p] = _mm256_unpacklo_epi8(r[2 * p], r[2 * p + 1]);
    a[2 * p + 1] = _mm256_unpackhi_epi8(r[2 * p], r[2 * p + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // b[4q + s]: bytes 4s .. 4s + 3 of rows 4q .. 4q + 3
    b[4 * q] = _mm256_unpacklo_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 1] = _mm256_unpackhi_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 2] = _mm256_unpacklo_epi16(a[4 * q + 1], a[4 * q + 3]);
    b[4 * q + 3] = _mm256_unpackhi_epi16(a[4 * q + 1], a[4 * q + 3]);
  }
  for (int o = 0; o < 2; ++o) {  // c[8o + t]: bytes 2t, 2t + 1 of rows 8o .. 8o + 7
    for (int s = 0; s < 4; ++s) {
      c[8 * o + 2 * s] = _mm256_unpacklo_epi32(b[8 * o + s], b[8 * o + 4 + s]);
      c[8 * o + 2 * s + 1] = _mm256_unpackhi_epi32(b[8 * o + s], b[8 * o + 4 + s]);
    }
  }
  for (int t = 0; t < 8; ++t) {  // r[i]: byte i of all 16 rows
    r[2 * t] = _mm256_unpacklo_epi64(c[t], c[8 + t]);
    r[2 * t + 1] = _mm256_unpackhi_epi64(c[t], c[8 + t]);
  }
}

// 16 unsigned bytes (one per weight row) widened to two vectors of floats: rows 0-7, 8-15.
inline void widen16(__m128i v, __m256* lo, __m256* hi) {
  *lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  *hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}

// Q4 groups b and b + 1 of weight rows n0 .. n0 + 15 (kinds 0 and 2) into 64 panel rows.
template <int Kind>
inline void q4_pair_panel(const Lin& w, int n0, int b, float* panel) {
  const int g = w.k / QK;
  __m256i r[PANEL_N];
  for (int j = 0; j < PANEL_N; ++j) {  // row j: group b in lane 0, group b + 1 in lane 1
    r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        w.q + (static_cast<size_t>(n0 + j) * g + b) * 16));
  }
  transpose16_bytes(r);  // r[i]: byte i (inputs i and i + 16) of every row, per group
  alignas(32) float d[2][PANEL_N], m[2][PANEL_N];
  for (int j = 0; j < PANEL_N; ++j) {
    const size_t at = static_cast<size_t>(n0 + j) * g + b;
    d[0][j] = q4_param<Kind>(w.d, at);
    d[1][j] = q4_param<Kind>(w.d, at + 1);
    m[0][j] = q4_param<Kind>(w.m, at);
    m[1][j] = q4_param<Kind>(w.m, at + 1);
  }
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int lane = 0; lane < 2; ++lane) {
    const __m256 d0 = _mm256_load_ps(d[lane]), d1 = _mm256_load_ps(d[lane] + 8);
    const __m256 m0 = _mm256_load_ps(m[lane]), m1 = _mm256_load_ps(m[lane] + 8);
    float* out = panel + lane * QK * PANEL_N;
    for (int i = 0; i < 16; ++i) {
      const __m256i v = r[i];
      const __m128i bytes = lane ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
      const __m128i lo = _mm_and_si128(bytes, _mm256_castsi256_si128(nibble));
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm256_castsi256_si128(nibble));
      __m256 f0, f1;
      widen16(lo, &f0, &f1);  // input i
      _mm256_store_ps(out + i * PANEL_N, _mm256_fmadd_ps(d0, f0, m0));
      _mm256_store_ps(out + i * PANEL_N + 8, _mm256_fmadd_ps(d1, f1, m1));
      widen16(hi, &f0, &f1);  // input i + 16
      _mm256_store_ps(out + (i + 16) * PANEL_N, _mm256_fmadd_ps(d0, f0, m0));
      _mm256_store_ps(out + (i + 16) * PANEL_N + 8, _mm256_fmadd_ps(d1, f1, m1));
    }
  }
}

// Weight rows n0 .. n0 + nr (nr <= 16) over inputs [k0, k0 + kc) as panel[kc][16] (rows past
// nr are zeros). k0 is a multiple of 32, and kc too but for an FP8 row's last window.
// `rowbuf` (16 x PANEL_K floats) is scratch for the kinds and panels the direct path does not
// take.
template <int Kind>
inline void fill_panel(const Lin& w, int n0, int nr, int k0, int kc, float* rowbuf,
                       float* panel) {
  const int g0 = k0 / QK, g1 = (k0 + kc) / QK;
  int b = g0;
  if (nr == PANEL_N) {
    if constexpr (Kind == 0 || Kind == 2) {
      for (; b + 2 <= g1; b += 2) q4_pair_panel<Kind>(w, n0, b, panel + (b - g0) * QK * PANEL_N);
    }
  }
  const int done = (b - g0) * QK;
  if (done < kc) {
    panel_by_rows<Kind>(w, n0, nr, k0 + done, kc - done, rowbuf, panel + done * PANEL_N);
  }
}

}  // namespace tnd
