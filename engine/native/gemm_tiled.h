// Linear layers for many activation rows (batched decodes, prefill chunks), AVX2 + FMA; the
// AVX-512 build (TND_AVX512) runs a 12 x 16 micro-kernel on 512-bit registers instead.
//
//   threads split the weight rows into panels of 16; for each panel and window of 256 inputs:
//     dequantize the 16 x 256 weights to fp32 and transpose them to [256][16] (16 KB: L1)
//     for every 6 activation rows: 6 x 16 outputs in 12 accumulators, one panel row (two
//       vectors) and six broadcast activations per input: 12 FMAs per 8 loads
//
// Each weight is read from memory once per step and turned into a float once, so the cost is
// the FMAs, not the unpacking (the few-row path of quant_linear.h instead spends ~7 integer
// ops per group of 32 per row). Activations stay fp32 here (no int16 rounding), so these
// products are closer to the dequantized model than the few-row path's.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "quant_linear.h"

namespace tnd {

// Groups [g0, g1) of weight row n as floats in dst (kind 3: copied; kinds 5 and 6: widened).
template <int Kind>
inline void dequant_groups(const Lin& w, int n, int g0, int g1, float* dst) {
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

constexpr int PANEL_N = 16;   // weight rows per panel (two vectors of outputs)
constexpr int PANEL_K = 256;  // inputs per panel: 16 KB of floats, in L1
#if TND_AVX512
constexpr int MICRO_M = 12;   // activation rows per micro-kernel call: 12 512-bit accumulators
#else
constexpr int MICRO_M = 6;    // activation rows per micro-kernel call: 12 accumulators
#endif

// c[i][0..16) (+)= sum_k x[i][k] * panel[k][0..16) for i < MR: one weight panel row (two
// vectors) per k, broadcast activations; 12 FMAs per 8 loads.
template <int MR>
inline void micro_panel(const float* x, int ldx, const float* panel, int kc, float* y, int ldy,
                        int nr, bool add) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(panel + k * PANEL_N);
    const __m256 b1 = _mm256_load_ps(panel + k * PANEL_N + 8);
#pragma GCC unroll 8  // unrolled, the accumulators stay in registers (else GCC spills them)
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + static_cast<size_t>(i) * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* out = y + static_cast<size_t>(i) * ldy;
    if (nr == PANEL_N) {
      if (add) {
        acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(out));
        acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(out + 8));
      }
      _mm256_storeu_ps(out, acc[i][0]);
      _mm256_storeu_ps(out + 8, acc[i][1]);
    } else {
      alignas(32) float v[PANEL_N];
      _mm256_store_ps(v, acc[i][0]);
      _mm256_store_ps(v + 8, acc[i][1]);
      for (int j = 0; j < nr; ++j) out[j] = add ? out[j] + v[j] : v[j];
    }
  }
}

#if TND_AVX512
// micro_panel with one 512-bit panel row per k (the 16 outputs in one register) and up to 12
// rows: 12 FMAs per 13 loads, each 16 wide. Every output lane sums its products in the same
// order as micro_panel's, so the two builds' tiled results are bit-identical.
template <int MR>
inline void micro_panel512(const float* x, int ldx, const float* panel, int kc, float* y,
                           int ldy, int nr, bool add) {
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 b = _mm512_load_ps(panel + k * PANEL_N);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[static_cast<size_t>(i) * ldx + k]), b, acc[i]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>(nr >= PANEL_N ? 0xFFFF : (1u << nr) - 1);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* out = y + static_cast<size_t>(i) * ldy;
    if (add) acc[i] = _mm512_add_ps(acc[i], _mm512_maskz_loadu_ps(mask, out));
    _mm512_mask_storeu_ps(out, mask, acc[i]);
  }
}
#endif

// The micro-kernel of this build for MR rows.
template <int MR>
inline void micro(const float* x, int ldx, const float* panel, int kc, float* y, int ldy, int nr,
                  bool add) {
#if TND_AVX512
  micro_panel512<MR>(x, ldx, panel, kc, y, ldy, nr, add);
#else
  micro_panel<MR>(x, ldx, panel, kc, y, ldy, nr, add);
#endif
}

// The last rows % MICRO_M rows (rem < MR + 1) with the kernel for exactly that many.
template <int MR>
inline void micro_tail(int rem, const float* x, int ldx, const float* panel, int kc, float* y,
                       int ldy, int nr, bool add) {
  if constexpr (MR > 0) {
    if (rem == MR) {
      micro<MR>(x, ldx, panel, kc, y, ldy, nr, add);
    } else {
      micro_tail<MR - 1>(rem, x, ldx, panel, kc, y, ldy, nr, add);
    }
  }
}

template <int Kind>
void linear_tiled_kind(const Lin& w, const float* x, int rows, float* y, int ldy, bool accumulate,
                       int threads) {
  const int k = w.k, panels = (w.n + PANEL_N - 1) / PANEL_N;
#pragma omp parallel num_threads(threads)
  {
    alignas(32) float rowbuf[PANEL_N * PANEL_K];  // 16 weight rows of one k window
    alignas(64) float panel[PANEL_K * PANEL_N];   // the same, transposed: [k][16]
    // Panels are handed out one at a time, not split up front: on a machine whose cores
    // other processes share (a prefill worker beside a decode worker), a thread the kernel
    // preempts then holds up one panel instead of half the layer while its partners wait at
    // the barrier. Each panel is computed by one thread either way, so results do not depend
    // on the schedule.
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < panels; ++t) {
      const int n0 = t * PANEL_N, nr = std::min(PANEL_N, w.n - n0);
      for (int k0 = 0; k0 < k; k0 += PANEL_K) {
        const int kc = std::min(PANEL_K, k - k0);
        for (int j = 0; j < PANEL_N; ++j) {
          float* dst = rowbuf + j * PANEL_K;
          if (j < nr) {
            dequant_groups<Kind>(w, n0 + j, k0 / QK, (k0 + kc) / QK, dst);
          } else {
            std::fill(dst, dst + kc, 0.f);
          }
        }
        for (int kk = 0; kk < kc; kk += 8) {
          transpose8(rowbuf + kk, PANEL_K, panel + kk * PANEL_N, PANEL_N);
          transpose8(rowbuf + 8 * PANEL_K + kk, PANEL_K, panel + kk * PANEL_N + 8, PANEL_N);
        }
        const bool add = accumulate || k0 > 0;
        const float* xk = x + k0;
        float* yt = y + n0;
        int r = 0;
        for (; r + MICRO_M <= rows; r += MICRO_M) {
          micro<MICRO_M>(xk + static_cast<size_t>(r) * k, k, panel, kc,
                         yt + static_cast<size_t>(r) * ldy, ldy, nr, add);
        }
        micro_tail<MICRO_M - 1>(rows - r, xk + static_cast<size_t>(r) * k, k, panel, kc,
                                yt + static_cast<size_t>(r) * ldy, ldy, nr, add);
      }
      if (w.bias) {
        for (int r = 0; r < rows; ++r) {
          for (int j = 0; j < nr; ++j) y[static_cast<size_t>(r) * ldy + n0 + j] += w.bias[n0 + j];
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
    case 5: linear_tiled_kind<5>(w, x, rows, y, ldy, accumulate, threads); break;
    case 6: linear_tiled_kind<6>(w, x, rows, y, ldy, accumulate, threads); break;
    default: linear_tiled_kind<3>(w, x, rows, y, ldy, accumulate, threads); break;
  }
}

// Row n of an embedding table stored as a Lin (any kind) as `k` floats.
inline void lin_row(const Lin& w, int64_t n, float* dst) {
  const int row = static_cast<int>(n), g = w.k / QK;
  switch (w.kind) {
    case 0: dequant_groups<0>(w, row, 0, g, dst); break;
    case 1: dequant_groups<1>(w, row, 0, g, dst); break;
    case 2: dequant_groups<2>(w, row, 0, g, dst); break;
    case 4: dequant_groups<4>(w, row, 0, g, dst); break;
    case 5: dequant_groups<5>(w, row, 0, g, dst); break;
    case 6: dequant_groups<6>(w, row, 0, g, dst); break;
    default: dequant_groups<3>(w, row, 0, g, dst); break;
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
