// The few-row integer loops of a linear in the AVX-512 build (TND_FEW_ROWS_512): the same
// structure as dot_rows in dot_rows.h, with _mm512_dpwssd_epi32 (VNNI) doing the
// multiply-adds: the same exact int32 products and sums, over two Q4 groups per pair of
// registers (dot_rows512_pairs, with QuantRows pair-interleaved) or one Q8 group per 512-bit
// register (dot_rows512_groups), so only the fp32 accumulation order differs from the AVX2
// loops. Empty in the AVX2 build. A one-row step keeps dot_1row (dot_rows.h) in both builds.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "dot_rows.h"
#include "quant_linear.h"

namespace tnd {

#if TND_FEW_ROWS_512
// Group b of a Q4 row as 32 int16 (low nibbles in lanes 0..15, high nibbles in 16..31): the
// 16 bytes loaded into both halves, widened, the upper half shifted right by 4.
inline __m512i q4_unpack512(const uint8_t* qs, int b, __m512i shift) {
  const __m512i v = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16))));
  return _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi16(0x0F));
}

// Group b of a Q8 row as 32 int16.
inline __m512i q8_unpack512(const int8_t* wq, int b) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + b * QK)));
}

// sum_j w[j] * x[j] over one group, as 16 float lanes (each lane an exact pair sum).
inline __m512 group_dot512(__m512i w, const int16_t* x) {
  return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x)));
}

// Groups b and b + 1 of a Q4 row as int16, matching QuantRows' paired layout: lo = both
// groups' elements 0..15 (low nibbles), hi = their elements 16..31 (high nibbles).
inline void q4_unpack_pair(const uint8_t* qs, int b, __m512i& lo, __m512i& hi) {
  const __m512i v =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 16)));
  lo = _mm512_and_si512(v, _mm512_set1_epi16(0x0F));
  hi = _mm512_srli_epi16(v, 4);
}

// The same for Q8: elements 0..15 of groups b and b + 1, then their elements 16..31.
inline void q8_unpack_pair(const int8_t* wq, int b, __m512i& lo, __m512i& hi) {
  const int8_t* p = wq + b * QK;
  auto half = [](const int8_t* a, const int8_t* c) {
    return _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(c)), 1));
  };
  lo = half(p, p + QK);
  hi = half(p + 16, p + QK + 16);
}

// dot_rows with two groups per step in 512-bit registers (see dot_rows for the structure), the
// Q4 kinds' loop (QuantRows in the paired layout):
// lanes 0..7 sum group b's products, lanes 8..15 group b + 1's (4 exact products a lane, two
// _mm512_dpwssd_epi32), one conversion and one FMA with [scale b x 8, scale b+1 x 8] per pair
// and row. A last unpaired group takes one register with its 32 values.
template <int Kind, int R>
inline void dot_rows512_pairs(const Lin& w, int n, const QuantRows& x, int r0, float* out) {
  constexpr bool Q4 = Kind == 0 || Kind == 2, G8 = Kind == 4, F16 = Kind == 2 || Kind == 4;
  const int g = w.k / QK;
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(w.d);  // kinds 2 and 4
  const uint8_t* qs = w.q + static_cast<size_t>(n) * g * 16;                           // Q4
  const int8_t* wq = reinterpret_cast<const int8_t*>(w.q) + static_cast<size_t>(n) * w.k;  // Q8
  const size_t row_groups = static_cast<size_t>(n) * g;
  const int16_t* xq[R];
  const float* xd[R];
  for (int i = 0; i < R; ++i) {
    xq[i] = x.q.data() + static_cast<size_t>(r0 + i) * x.k;
    xd[i] = x.d.data() + static_cast<size_t>(r0 + i) * g;
  }
  // pair p of an 8-group scale block: lanes 0..7 scale 2p, lanes 8..15 scale 2p + 1
  const __m512i pick[4] = {
      _mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(1), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(2), _mm256_set1_epi32(3), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(5), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(6), _mm256_set1_epi32(7), 1)};
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  alignas(32) float sc[R][8];
  __m512i lo, hi;
  for (int b = 0; b < g; b += 8) {
    const int nb = std::min(8, g - b);
    {  // a partial last block through masked loads
      const __mmask8 t = static_cast<__mmask8>(nb == 8 ? 0xFF : (1u << nb) - 1);
      const __m256 dw = F16 ? _mm256_cvtph_ps(_mm_maskz_loadu_epi16(t, d16 + row_groups + b))
                        : Kind == 0 ? _mm256_maskz_loadu_ps(t, w.d + row_groups + b)
                                    : _mm256_set1_ps(1.f);
      for (int i = 0; i < R; ++i) {
        _mm256_store_ps(sc[i], _mm256_mul_ps(dw, _mm256_maskz_loadu_ps(t, xd[i] + b)));
      }
    }
    int j = 0;
    for (; j + 1 < nb; j += 2) {
      const int b0 = b + j;
      if (Q4) {
        _mm_prefetch(reinterpret_cast<const char*>(qs + b0 * 16 + PREFETCH_BYTES), _MM_HINT_T0);
        q4_unpack_pair(qs, b0, lo, hi);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(wq + b0 * QK + 2 * PREFETCH_BYTES), _MM_HINT_T0);
        q8_unpack_pair(wq, b0, lo, hi);
      }
      const __m512i idx = pick[j / 2];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const int16_t* xp = xq[i] + b0 * QK;
        const __m512i p = _mm512_dpwssd_epi32(
            _mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xp)), hi,
            _mm512_loadu_si512(xp + 32));
        const __m512 s = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_load_ps(sc[i])));
        if (j & 2) {
          acc1[i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc1[i]);
        } else {
          acc0[i] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc0[i]);
        }
      }
    }
    if (j < nb) {  // the row's last group when g is odd: its 32 values as stored
      const int b0 = b + j;
      const __m512i w0 = Q4 ? q4_unpack512(qs, b0, _mm512_inserti64x4(
                                  _mm512_setzero_si512(), _mm256_set1_epi16(4), 1))
                            : q8_unpack512(wq, b0);
      for (int i = 0; i < R; ++i) {
        acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i][j]), group_dot512(w0, xq[i] + b0 * QK),
                                  acc0[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
    if (Q4) {  // + sum_b m[b] * sum_j x[j] (the zero points)
      const float* m = Kind == 2 ? reinterpret_cast<const float*>(
                                       reinterpret_cast<const uint16_t*>(w.m) + row_groups)
                                 : w.m + row_groups;
      out[i] = dot + zero_point_dot<Kind>(m, x.s.data() + static_cast<size_t>(r0 + i) * g, g);
    } else {
      out[i] = G8 ? dot : dot * w.d[n];
    }
  }
}
// dot_rows with one group per 512-bit register (see dot_rows for the structure): the Q8 kinds'
// loop (QuantRows in group order). Against dot_rows512_pairs it saves the per-pair shuffles
// of Q8 bytes; measured 1.17-1.24x the AVX2 loop for one row, the pair loop 0.95-1.17x.
template <int Kind, int R>
inline void dot_rows512_groups(const Lin& w, int n, const QuantRows& x, int r0, float* out) {
  constexpr bool Q4 = Kind == 0 || Kind == 2, G8 = Kind == 4, F16 = Kind == 2 || Kind == 4;
  const int g = w.k / QK;
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(w.d);  // kinds 2 and 4
  const uint8_t* qs = w.q + static_cast<size_t>(n) * g * 16;                           // Q4
  const int8_t* wq = reinterpret_cast<const int8_t*>(w.q) + static_cast<size_t>(n) * w.k;  // Q8
  const size_t row_groups = static_cast<size_t>(n) * g;
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const int16_t* xq[R];
  const float* xd[R];
  for (int i = 0; i < R; ++i) {
    xq[i] = x.q.data() + static_cast<size_t>(r0 + i) * x.k;
    xd[i] = x.d.data() + static_cast<size_t>(r0 + i) * g;
  }
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  alignas(32) float sc[R][8];
  for (int b = 0; b < g; b += 8) {
    const int nb = std::min(8, g - b);
    {  // a partial last block through masked loads
      const __mmask8 t = static_cast<__mmask8>(nb == 8 ? 0xFF : (1u << nb) - 1);
      const __m256 dw = F16 ? _mm256_cvtph_ps(_mm_maskz_loadu_epi16(t, d16 + row_groups + b))
                        : Kind == 0 ? _mm256_maskz_loadu_ps(t, w.d + row_groups + b)
                                    : _mm256_set1_ps(1.f);
      for (int i = 0; i < R; ++i) {
        _mm256_store_ps(sc[i], _mm256_mul_ps(dw, _mm256_maskz_loadu_ps(t, xd[i] + b)));
      }
    }
    for (int j = 0; j < nb; j += 2) {
      const int b0 = b + j;
      __m512i w0;
      if (Q4) {
        _mm_prefetch(reinterpret_cast<const char*>(qs + b0 * 16 + PREFETCH_BYTES), _MM_HINT_T0);
        w0 = q4_unpack512(qs, b0, shift);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(wq + b0 * QK + 2 * PREFETCH_BYTES), _MM_HINT_T0);
        w0 = q8_unpack512(wq, b0);
      }
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        acc0[i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i][j]), group_dot512(w0, xq[i] + b0 * QK),
                                  acc0[i]);
      }
      if (j + 1 < nb) {
        const __m512i w1 = Q4 ? q4_unpack512(qs, b0 + 1, shift) : q8_unpack512(wq, b0 + 1);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          acc1[i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i][j + 1]),
                                    group_dot512(w1, xq[i] + (b0 + 1) * QK), acc1[i]);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
    if (Q4) {  // + sum_b m[b] * sum_j x[j] (the zero points)
      const float* m = Kind == 2 ? reinterpret_cast<const float*>(
                                       reinterpret_cast<const uint16_t*>(w.m) + row_groups)
                                 : w.m + row_groups;
      out[i] = dot + zero_point_dot<Kind>(m, x.s.data() + static_cast<size_t>(r0 + i) * g, g);
    } else {
      out[i] = G8 ? dot : dot * w.d[n];
    }
  }
}
#endif  // TND_FEW_ROWS_512

}  // namespace tnd
