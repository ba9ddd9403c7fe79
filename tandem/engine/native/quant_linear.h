// Matrix-vector products for a few activation rows (AVX2): Q4 groups, Q8 rows, float rows.
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
// These loops serve steps of a few rows (decodes); gemm_tiled.h serves many rows.
// For kinds 0, 1, 2 and 4 activations are quantized to int16 in groups of 32 and the products run on
// integers (_mm256_madd_epi16), accumulated in fp32 once per group. In the AVX-512 build
// (TND_AVX512) _mm512_dpwssd_epi32 (VNNI) does the multiply-adds: the same exact int32
// products and sums, over one Q8 group per 512-bit register (dot_rows512_groups) or two Q4
// groups per pair of registers (dot_rows512_pairs, with QuantRows pair-interleaved), so only
// the fp32 accumulation order differs. A one-row step (a lone decode) takes dot_1row in both
// builds: four weight rows at a time, the 256-bit loop.
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
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "half.h"
#include "paged_attention.h"  // hsum, load8

namespace tnd {

constexpr int QK = 32;  // quantization group (weights and activations)

struct Lin {
  int32_t kind;  // 0 = Q4 groups, 1 = Q8 rows, 2 = Q4 groups with fp16 d and m, 3 = fp32,
                 // 4 = Q8 groups with fp16 d, 5 = bf16, 6 = fp16
  int32_t n, k;
  const uint8_t* q;
  const float* d;
  const float* m;     // Q4 only (kinds 0 and 2; fp16 for kind 2, as d)
  const float* bias;  // may be null
};

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

// Scale of group i of a Q4 matrix (fp32, or fp16 for kind 2).
template <int Kind>
inline float q4_param(const float* p, size_t i) {
  return Kind == 2 ? _cvtsh_ss(reinterpret_cast<const uint16_t*>(p)[i]) : p[i];
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

// Kinds whose weights are floats (fp32, bf16, fp16): activations stay fp32, nothing is
// quantized.
constexpr bool float_kind(int kind) { return kind == 3 || kind == 5 || kind == 6; }

// Weight type of a float kind.
template <int Kind> struct FloatWeight { using T = float; };
template <> struct FloatWeight<5> { using T = bf16; };
template <> struct FloatWeight<6> { using T = f16; };

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

template <int Kind>
inline void dot_block(const Lin& w, int n, const float* xf, const QuantRows& x, int r0, int cnt,
                      float* out) {
  if constexpr (float_kind(Kind)) {
    switch (cnt) {
      case 1: dot_rows_f32<Kind, 1>(w, n, xf, w.k, r0, out); break;
      case 2: dot_rows_f32<Kind, 2>(w, n, xf, w.k, r0, out); break;
      case 3: dot_rows_f32<Kind, 3>(w, n, xf, w.k, r0, out); break;
      default: dot_rows_f32<Kind, 4>(w, n, xf, w.k, r0, out); break;
    }
  } else {
#if TND_FEW_ROWS_512
    if constexpr (paired_kind(Kind)) {
      switch (cnt) {
        case 1: dot_rows512_pairs<Kind, 1>(w, n, x, r0, out); break;
        case 2: dot_rows512_pairs<Kind, 2>(w, n, x, r0, out); break;
        case 3: dot_rows512_pairs<Kind, 3>(w, n, x, r0, out); break;
        default: dot_rows512_pairs<Kind, 4>(w, n, x, r0, out); break;
      }
    } else {
      switch (cnt) {
        case 1: dot_rows512_groups<Kind, 1>(w, n, x, r0, out); break;
        case 2: dot_rows512_groups<Kind, 2>(w, n, x, r0, out); break;
        case 3: dot_rows512_groups<Kind, 3>(w, n, x, r0, out); break;
        default: dot_rows512_groups<Kind, 4>(w, n, x, r0, out); break;
      }
    }
#else
    switch (cnt) {
      case 1: dot_rows<Kind, 1>(w, n, x, r0, out); break;
      case 2: dot_rows<Kind, 2>(w, n, x, r0, out); break;
      case 3: dot_rows<Kind, 3>(w, n, x, r0, out); break;
      default: dot_rows<Kind, 4>(w, n, x, r0, out); break;
    }
#endif
  }
}

// y[r, n] (+)= x[r] . w[n] (+ bias[n]) for all rows; rows of the output are `ldy` apart.
template <int Kind>
void linear_kind(const Lin& w, const float* xf, const QuantRows& x, int rows, float* y, int ldy,
                 bool accumulate, int threads) {
  // Output rows in chunks of ~1/8 of a thread's share, taken as threads free up (see
  // linear_tiled_kind: a preempted thread delays one chunk, not its whole half).
  const int chunk = std::max(8, w.n / (8 * std::max(1, threads)));
  if constexpr (!float_kind(Kind)) {
    if (rows == 1) {  // NR1 weight rows per iteration (dot_1row), in chunks of whole blocks
      constexpr int NR1 = ONE_ROW_BLOCK;
      const int blocks = w.n / NR1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, std::max(2, chunk / NR1))
      for (int bi = 0; bi <= blocks; ++bi) {
        const int n0 = bi * NR1, cnt = std::min(NR1, w.n - n0);
        float v[NR1];
        if (cnt == NR1) {
          dot_1row<Kind, NR1>(w, n0, x, v);
        } else {
          for (int i = 0; i < cnt; ++i) dot_1row<Kind, 1>(w, n0 + i, x, v + i);
        }
        for (int i = 0; i < cnt; ++i) {
          const float bias = w.bias ? w.bias[n0 + i] : 0.f;
          y[n0 + i] = accumulate ? y[n0 + i] + v[i] + bias : v[i] + bias;
        }
      }
      return;
    }
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, chunk)
  for (int n = 0; n < w.n; ++n) {
    const float bias = w.bias ? w.bias[n] : 0.f;
    for (int r0 = 0; r0 < rows; r0 += MAX_ROW_BLOCK) {
      const int cnt = std::min(MAX_ROW_BLOCK, rows - r0);
      float v[MAX_ROW_BLOCK];
      dot_block<Kind>(w, n, xf, x, r0, cnt, v);
      for (int i = 0; i < cnt; ++i) {
        float* out = y + static_cast<size_t>(r0 + i) * ldy + n;
        *out = accumulate ? *out + v[i] + bias : v[i] + bias;
      }
    }
  }
}

// y [rows, N] (+)= x [rows, K] . w^T (+ bias) for a few rows; x is fp32, quantized into
// `scratch` first unless the weights are floats.
inline void linear_rows(const Lin& w, const float* x, int rows, QuantRows& scratch, float* y,
                        int ldy, bool accumulate, int threads) {
  if (!float_kind(w.kind)) scratch.quantize(x, rows, w.k, paired_kind(w.kind) && rows > 1);
  switch (w.kind) {
    case 0: linear_kind<0>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    case 1: linear_kind<1>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    case 2: linear_kind<2>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    case 4: linear_kind<4>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    case 5: linear_kind<5>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    case 6: linear_kind<6>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    default: linear_kind<3>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
  }
}

}  // namespace tnd
