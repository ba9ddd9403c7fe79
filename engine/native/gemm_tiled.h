// Linear layers for many activation rows (batched decodes, prefill chunks), AVX2 + FMA.
//
//   for each block of 64 rows of x (kept in L2):
//     for each tile of 4 weight rows (threads split the tiles):
//       dequantize the tile to fp32 (a few KB: stays in L1)
//       2 x-rows x 4 weight-rows micro-kernel: 8 fp32 accumulators along K, one FMA each
//
// The weights are read once per 64 rows and turned into floats once per tile, so the cost
// is the FMAs (8 per 64 multiply-adds), not the unpacking: the small-row path of
// quant_linear.h instead spends ~7 integer ops per group of 32 per row. Activations stay
// fp32 here (no int16 rounding), so these products are closer to the dequantized model than
// the small-row path's.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "quant_linear.h"

namespace tnd {

constexpr int TILE_N = 4;   // weight rows per tile
constexpr int BLOCK_M = 64;  // activation rows per block

// 8 fp16 values widened.
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Weight row n of `w` as K floats in dst (kinds 0, 1, 2 and 4; kind 3 is read in place).
template <int Kind>
inline void dequant_row(const Lin& w, int n, float* dst) {
  const int g = w.k / QK;
  const size_t row_groups = static_cast<size_t>(n) * g;
  if constexpr (Kind == 0 || Kind == 2) {
    const uint8_t* qs = w.q + row_groups * 16;
    for (int b = 0; b < g; ++b) {
      const __m256 d = _mm256_set1_ps(q4_param<Kind>(w.d, row_groups + b));
      const __m256 m = _mm256_set1_ps(q4_param<Kind>(w.m, row_groups + b));
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16));
      const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
      float* o = dst + b * QK;
      _mm256_storeu_ps(o, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m));
      _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(
          d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m));
      _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m));
      _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(
          d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m));
    }
  } else {  // int8 values: one scale per row (kind 1) or per group of 32 in fp16 (kind 4)
    const int8_t* q = reinterpret_cast<const int8_t*>(w.q) + static_cast<size_t>(n) * w.k;
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(w.d);
    for (int b = 0; b < g; ++b) {
      const __m256 d = _mm256_set1_ps(Kind == 1 ? w.d[n] : _cvtsh_ss(d16[row_groups + b]));
      const int8_t* qb = q + b * QK;
      float* o = dst + b * QK;
      for (int j = 0; j < QK; j += 8) {
        const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + j)));
        _mm256_storeu_ps(o + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
      }
    }
  }
}

// out[i][j] = x[i] . w[j] for i < MR, j < NR (x rows ldx apart, w rows ldw apart; K % 8 == 0).
template <int MR, int NR>
inline void micro(const float* x, int ldx, const float* w, int ldw, int k, float* out) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (int p = 0; p < k; p += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + static_cast<size_t>(j) * ldw + p);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + static_cast<size_t>(i) * ldx + p);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) out[i * NR + j] = hsum(acc[i][j]);
  }
}

template <int MR>
inline void micro_n(const float* x, int ldx, const float* w, int ldw, int k, int nr, float* out) {
  switch (nr) {
    case 1: micro<MR, 1>(x, ldx, w, ldw, k, out); break;
    case 2: micro<MR, 2>(x, ldx, w, ldw, k, out); break;
    case 3: micro<MR, 3>(x, ldx, w, ldw, k, out); break;
    default: micro<MR, 4>(x, ldx, w, ldw, k, out); break;
  }
}

// y [rows, N] (+)= x [rows, K] . w^T (+ bias), fp32 activations, any weight kind.
template <int Kind>
void linear_tiled_kind(const Lin& w, const float* x, int rows, float* y, int ldy, bool accumulate,
                       int threads) {
  const int k = w.k, tiles = (w.n + TILE_N - 1) / TILE_N;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> buf(Kind == 3 ? 0 : static_cast<size_t>(TILE_N) * k);
    for (int m0 = 0; m0 < rows; m0 += BLOCK_M) {
      const int m1 = std::min(rows, m0 + BLOCK_M);
#pragma omp for schedule(static) nowait
      for (int t = 0; t < tiles; ++t) {
        const int n0 = t * TILE_N, nr = std::min(TILE_N, w.n - n0);
        const float* wt;
        if constexpr (Kind == 3) {
          wt = reinterpret_cast<const float*>(w.q) + static_cast<size_t>(n0) * k;
        } else {
          for (int j = 0; j < nr; ++j) dequant_row<Kind>(w, n0 + j, buf.data() + static_cast<size_t>(j) * k);
          wt = buf.data();
        }
        float v[2 * TILE_N];
        for (int r = m0; r < m1; r += 2) {
          const int mr = std::min(2, m1 - r);
          const float* xr = x + static_cast<size_t>(r) * k;
          if (mr == 2) micro_n<2>(xr, k, wt, k, k, nr, v); else micro_n<1>(xr, k, wt, k, k, nr, v);
          for (int i = 0; i < mr; ++i) {
            float* out = y + static_cast<size_t>(r + i) * ldy + n0;
            for (int j = 0; j < nr; ++j) {
              const float val = v[i * nr + j] + (w.bias ? w.bias[n0 + j] : 0.f);
              out[j] = accumulate ? out[j] + val : val;
            }
          }
        }
      }
    }
  }
}

inline void linear_tiled(const Lin& w, const float* x, int rows, float* y, int ldy,
                         bool accumulate, int threads) {
  switch (w.kind) {
    case 0: linear_tiled_kind<0>(w, x, rows, y, ldy, accumulate, threads); break;
    case 1: linear_tiled_kind<1>(w, x, rows, y, ldy, accumulate, threads); break;
    case 2: linear_tiled_kind<2>(w, x, rows, y, ldy, accumulate, threads); break;
    case 4: linear_tiled_kind<4>(w, x, rows, y, ldy, accumulate, threads); break;
    default: linear_tiled_kind<3>(w, x, rows, y, ldy, accumulate, threads); break;
  }
}

// Row n of an embedding table stored as a Lin (any kind) as `k` floats.
inline void lin_row(const Lin& w, int64_t n, float* dst) {
  switch (w.kind) {
    case 0: dequant_row<0>(w, static_cast<int>(n), dst); break;
    case 1: dequant_row<1>(w, static_cast<int>(n), dst); break;
    case 2: dequant_row<2>(w, static_cast<int>(n), dst); break;
    case 4: dequant_row<4>(w, static_cast<int>(n), dst); break;
    default: {
      const float* src = reinterpret_cast<const float*>(w.q) + static_cast<size_t>(n) * w.k;
      std::copy(src, src + w.k, dst);
    }
  }
}

}  // namespace tnd

namespace tnd {

// Rows from which a linear layer takes the tiled fp32 path (set from bench/native_rows.py).
constexpr int TILED_MIN_ROWS = 8;

// y [rows, N] (+)= x [rows, K] . w^T (+ bias): the small-row integer loops or the tiled path.
inline void linear(const Lin& w, const float* x, int rows, QuantRows& scratch, float* y, int ldy,
                   bool accumulate, int threads) {
  if (rows >= TILED_MIN_ROWS) {
    linear_tiled(w, x, rows, y, ldy, accumulate, threads);
  } else {
    linear_rows(w, x, rows, scratch, y, ldy, accumulate, threads);
  }
}

}  // namespace tnd
