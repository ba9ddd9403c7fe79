// The few-row loops of a linear (1-7 activation rows against every weight row), on 256-bit
// registers: the integer ones for the quantized kinds (dot_rows for 2-7 rows; dot_1row for a
// one-row step, in both builds) and the fp32 one for the float kinds (dot_rows_f32).
// Kept apart from their AVX-512 versions (dot_rows512.h) and from the dispatch that picks one
// per kind and row count (linear_rows.h).
//
// The integer loops take activations quantized to int16 in groups of 32 (QuantRows,
// quant_linear.h): the products run on integers (_mm256_madd_epi16) and are accumulated in
// fp32 once per group. A one-row step (a lone decode) takes dot_1row in both builds: four
// weight rows at a time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "half.h"
#include "quant_linear.h"
#include "vec_math.h"

namespace tnd {

// Weights are read once per step, so these loops run at memory speed for a decode. Steps of
// 2-7 rows (dot_rows): one weight row at a time, two groups per iteration, up to four
// activation rows sharing each loaded and unpacked weight group; their arithmetic remains
// (~4 ms per extra row for SmolLM2 int4 on the 2-core Zen 3 box). One-row steps (dot_1row):
// ONE_ROW_BLOCK weight rows at a time against the one activation row, the next block's bytes
// prefetched meanwhile. Measured on the 2-core Sapphire Rapids VM (one row, 2 threads, AVX2
// build): SmolLM2's 120 Q4_1 linears (66 MB) 4.7-5.2 ms one weight row at a time, 3.3-3.8 ms
// four, its Q8_0 lm_head (30 MB) 1.5-1.8 -> 0.95-1.2 ms; four rows without the far prefetch
// were slower than one (5.9-6.0 ms for the Q4 linears; on the Zen 3 box 9.7 against 5.7).
// Overflow: |x| <= 32767 and |w| <= 127, so the 8 int32 lanes of a group (4 products each)
// stay below 2^24.
constexpr int MAX_ROW_BLOCK = 4;
constexpr int ONE_ROW_BLOCK = 4;  // 2: 1.1x slower, 8: 1.3x (accumulators spill)
// How far ahead of the Q4 stream a weight row is prefetched (Q8: twice as far); 1024
// measured no better on the 2-core EPYC box (the hardware prefetcher follows the rows).
constexpr int PREFETCH_BYTES = 256;

// Group b of a Q4 row as int16: elements 0..15 (low nibbles) and 16..31 (high nibbles).
inline void q4_unpack(const uint8_t* qs, int b, __m256i& lo, __m256i& hi) {
  const __m256i v =
      _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16)));
  lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
  hi = _mm256_srli_epi16(v, 4);
}

// Group b of a Q8 row as int16.
inline void q8_unpack(const int8_t* wq, int b, __m256i& lo, __m256i& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + b * QK));
  lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
  hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
}

// sum_j w[j] * x[j] over one group, as 8 float lanes.
inline __m256 group_dot(__m256i lo, __m256i hi, const int16_t* x) {
  const __m256i p = _mm256_add_epi32(
      _mm256_madd_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))),
      _mm256_madd_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16))));
  return _mm256_cvtepi32_ps(p);
}

// sum_j m[j] * xs[j] over a row's groups (the zero points' share of a Q4 dot product).
template <int Kind>
inline float zero_point_dot(const float* m, const float* xs, int g) {
  float acc = 0.f;
  if (Kind == 2) {
    const uint16_t* m16 = reinterpret_cast<const uint16_t*>(m);
    int j = 0;
    __m256 v = _mm256_setzero_ps();
    for (; j + 8 <= g; j += 8) {
      const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m16 + j)));
      v = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xs + j), v);
    }
#if TND_FEW_ROWS_512
    if (j < g) {  // the last g % 8 groups in one masked step
      const __mmask8 t = static_cast<__mmask8>((1u << (g - j)) - 1);
      const __m256 mv = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(t, m16 + j));
      v = _mm256_fmadd_ps(mv, _mm256_maskz_loadu_ps(t, xs + j), v);
    }
    acc = hsum(v);
#else
    acc = hsum(v);
    for (; j < g; ++j) acc += _cvtsh_ss(m16[j]) * xs[j];
#endif
  } else {
#pragma omp simd reduction(+ : acc)
    for (int j = 0; j < g; ++j) acc += m[j] * xs[j];
  }
  return acc;
}

// out[i] = w[n] . x[r0 + i] for i < R (R activation rows against one weight row).
template <int Kind, int R>
inline void dot_rows(const Lin& w, int n, const QuantRows& x, int r0, float* out) {
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
  __m256 acc0[R], acc1[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
  // Eight groups at a time: their weight scales times each row's activation scales in one
  // vector op, so a group costs one broadcast load of its scale (not a conversion and a
  // scalar multiply per group and row).
  alignas(32) float sc[R][8];
  __m256i lo, hi;
  for (int b = 0; b < g; b += 8) {
    const int nb = std::min(8, g - b);
    if (nb == 8) {
      const __m256 dw =
          F16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + row_groups + b)))
          : Kind == 0 ? _mm256_loadu_ps(w.d + row_groups + b) : _mm256_set1_ps(1.f);
      for (int i = 0; i < R; ++i) _mm256_store_ps(sc[i], _mm256_mul_ps(dw, _mm256_loadu_ps(xd[i] + b)));
    } else {
      for (int j = 0; j < nb; ++j) {
        const float dw = F16 ? _cvtsh_ss(d16[row_groups + b + j])
                         : Kind == 0 ? w.d[row_groups + b + j] : 1.f;
        for (int i = 0; i < R; ++i) sc[i][j] = dw * xd[i][b + j];
      }
    }
    for (int j = 0; j < nb; j += 2) {
      const int b0 = b + j;
      if (Q4) {
        _mm_prefetch(reinterpret_cast<const char*>(qs + b0 * 16 + PREFETCH_BYTES), _MM_HINT_T0);
        q4_unpack(qs, b0, lo, hi);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(wq + b0 * QK + 2 * PREFETCH_BYTES), _MM_HINT_T0);
        q8_unpack(wq, b0, lo, hi);
      }
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        acc0[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[i][j]),
                                  group_dot(lo, hi, xq[i] + b0 * QK), acc0[i]);
      }
      if (j + 1 < nb) {
        if (Q4) q4_unpack(qs, b0 + 1, lo, hi); else q8_unpack(wq, b0 + 1, lo, hi);
  #pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
          acc1[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[i][j + 1]),
                                    group_dot(lo, hi, xq[i] + (b0 + 1) * QK), acc1[i]);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const float dot = hsum(_mm256_add_ps(acc0[i], acc1[i]));
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

// One activation row against NR weight rows n .. n + NR - 1 (a one-row step's linears, in
// both builds; QuantRows in group order): each loaded activation group serves NR weight
// groups, and NR independent FMA chains hide the latency of the one or two chains of
// dot_rows<Kind, 1> (a conversion and an FMA per group on each). The zero points' share (Q4
// kinds) is an FMA per 8 groups beside the group scales, summed with the products at the end.
template <int Kind, int NR>
inline void dot_1row(const Lin& w, int n, const QuantRows& x, float* out) {
  constexpr bool Q4 = Kind == 0 || Kind == 2, F16 = Kind == 2 || Kind == 4;
  const int g = w.k / QK;
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(w.d);  // kinds 2 and 4
  const uint16_t* m16 = reinterpret_cast<const uint16_t*>(w.m);  // kind 2
  size_t rg[NR];
  for (int r = 0; r < NR; ++r) rg[r] = static_cast<size_t>(n + r) * g;
  const int16_t* xq = x.q.data();
  const float* xd = x.d.data();
  const float* xs = x.s.data();
  __m256 acc[NR], zacc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = zacc[r] = _mm256_setzero_ps();
  alignas(32) float sc[NR][8];
  auto unpack = [&](int r, int b, __m256i& lo, __m256i& hi) {
    if (Q4) {
      q4_unpack(w.q + rg[r] * 16, b, lo, hi);
    } else {
      q8_unpack(reinterpret_cast<const int8_t*>(w.q) + rg[r] * QK, b, lo, hi);
    }
  };
  // The next NR rows' weights (contiguous: NR x g groups of gb bytes) are prefetched while
  // these are read, NR * gb bytes per group read, so all of them are asked for meanwhile; the
  // hardware prefetcher alone left the interleaved rows slower than one row at a time.
  constexpr int gb = Q4 ? 16 : QK;  // bytes of a weight group
  const char* next = reinterpret_cast<const char*>(w.q) + (rg[0] + NR * g) * gb;
  auto prefetch_next = [&](int b) {
#pragma GCC unroll 4
    for (int off = 0; off < NR * gb; off += 64) _mm_prefetch(next + b * NR * gb + off, _MM_HINT_T0);
  };
  int b = 0;
  for (; b + 8 <= g; b += 8) {
    const __m256 xdv = _mm256_loadu_ps(xd + b);
    for (int r = 0; r < NR; ++r) {
      const __m256 dw =
          F16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + rg[r] + b)))
          : Kind == 0 ? _mm256_loadu_ps(w.d + rg[r] + b) : _mm256_set1_ps(1.f);
      _mm256_store_ps(sc[r], _mm256_mul_ps(dw, xdv));
      if (Q4) {
        const __m256 mw =
            Kind == 2 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m16 + rg[r] + b)))
                      : _mm256_loadu_ps(w.m + rg[r] + b);
        zacc[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + b), zacc[r]);
      }
    }
    if (F16 || Kind == 0) {  // the next NR rows' scales (and zero points) for this block
      const size_t i = rg[0] + NR * g + b;
      _mm_prefetch(Kind == 0 ? reinterpret_cast<const char*>(w.d + i)
                             : reinterpret_cast<const char*>(d16 + i), _MM_HINT_T0);
      if (Q4) {
        _mm_prefetch(Kind == 0 ? reinterpret_cast<const char*>(w.m + i)
                               : reinterpret_cast<const char*>(m16 + i), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      prefetch_next(b + j);
      const int16_t* xb = xq + (b + j) * QK;
      const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
      const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m256i lo, hi;
        unpack(r, b + j, lo, hi);
        const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, xl), _mm256_madd_epi16(hi, xh));
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[r][j]), _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
  }
  float tail[NR] = {};
  for (; b < g; ++b) {  // the last g % 8 groups
    prefetch_next(b);
    const int16_t* xb = xq + b * QK;
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
    for (int r = 0; r < NR; ++r) {
      __m256i lo, hi;
      unpack(r, b, lo, hi);
      const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, xl), _mm256_madd_epi16(hi, xh));
      const float dw = F16 ? _cvtsh_ss(d16[rg[r] + b]) : Kind == 0 ? w.d[rg[r] + b] : 1.f;
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[b]), _mm256_cvtepi32_ps(p), acc[r]);
      if (Q4) tail[r] += (Kind == 2 ? _cvtsh_ss(m16[rg[r] + b]) : w.m[rg[r] + b]) * xs[b];
    }
  }
  for (int r = 0; r < NR; ++r) {
    const float dot = hsum(_mm256_add_ps(acc[r], zacc[r])) + tail[r];
    out[r] = Kind == 1 ? dot * w.d[n + r] : dot;
  }
}

// out[i] = w[n] . x[r0 + i] for i < R, float weights (fp32, or bf16/fp16 widened on load) and
// fp32 activations (rows ldx floats apart). The K loop is unrolled U times so at least four
// FMA chains are in flight (one chain waits out the FMA latency: 1 row ran at a quarter of
// the FMA throughput, 9 rows 2.3x one row).
template <int Kind, int R>
inline void dot_rows_f32(const Lin& w, int n, const float* x, int ldx, int r0, float* out) {
  using T = typename FloatWeight<Kind>::T;
  constexpr int U = R == 1 ? 4 : 2;
  const T* wr = reinterpret_cast<const T*>(w.q) + static_cast<size_t>(n) * w.k;
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + static_cast<size_t>(r0 + i) * ldx;
  __m256 acc[R][U];
  for (int i = 0; i < R; ++i) {
    for (int u = 0; u < U; ++u) acc[i][u] = _mm256_setzero_ps();
  }
  int j = 0;
  for (; j + 8 * U <= w.k; j += 8 * U) {
    _mm_prefetch(reinterpret_cast<const char*>(wr + j + 128), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const __m256 wv = load8(wr + j + 8 * u);
      for (int i = 0; i < R; ++i) {
        acc[i][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[i] + j + 8 * u), acc[i][u]);
      }
    }
  }
  for (; j < w.k; j += 8) {  // K % 32 == 0, so only when U does not divide K / 8
    const __m256 wv = load8(wr + j);
    for (int i = 0; i < R; ++i) acc[i][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[i] + j), acc[i][0]);
  }
  for (int i = 0; i < R; ++i) {
    __m256 sum = acc[i][0];
    for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[i][u]);
    out[i] = hsum(sum);
  }
}

}  // namespace tnd
