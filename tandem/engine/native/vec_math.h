// Vector building blocks the kernels share (AVX2; 512-bit loads in the AVX-512 build): a
// horizontal sum, 8 or 16 cache or weight values widened to floats (fp32, int8; bf16 and
// fp16 in half.h; e4m3 in e4m3.h), dot and axpy over any of those, a vectorized exp and a NaN-skipping max
// (the attention's softmax), four 8-lane sums in one reduction, and the gated MLP's
// silu(gate) * up (the dense MLP of decode_step.cpp and the experts of moe_experts.h). The
// few-row linears (dot_rows.h) and the attention (kv_head.h, paged_attention.h) include them
// from here.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "e4m3.h"
#include "half.h"

namespace tnd {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// 8 cache values as 8 floats: fp32 as they are, int8 widened.
inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load8(const int8_t* x) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
}

// The AVX-512 build (the avx512 variant's flags) runs the attention's GQA-shared loops
// (kv_head.h) on 512-bit registers: half the multiply-adds and loads of the 256-bit ones.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TND_ATTN_512 1
// 16 cache values as 16 floats.
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const int8_t* x) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
}
inline __m512 load16(const bf16* x) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
inline __m512 load16(const f16* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
#else
#define TND_ATTN_512 0
#endif

// sum_i a[i] * b[i], b fp32, int8, bf16, fp16 or e4m3 (its values times 2^-8).
template <class T>
inline float dot(const float* a, const T* b, int n) {
  if (n % 8 == 0) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc);
    return hsum(acc);
  }
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * static_cast<float>(b[i]);
  return s;
}

// y += w * x, x fp32, int8, bf16, fp16 or e4m3 (its values times 2^-8).
template <class T>
inline void axpy(float w, const T* x, float* y, int n) {
  int i = 0;
  if (n % 8 == 0) {
    const __m256 wv = _mm256_set1_ps(w);
    for (; i < n; i += 8) {
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, load8(x + i), _mm256_loadu_ps(y + i)));
    }
  }
  for (; i < n; ++i) y[i] += w * static_cast<float>(x[i]);
}

// exp(x) on 8 lanes (Cephes' expf: Cody-Waite reduction, degree-5 polynomial; ~1 ulp).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// a[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u for i < n (8 lanes at a time, the tail
// with std::exp).
inline void silu_mul(const float* g, const float* u, float* a, int n) {
  const __m256 one = _mm256_set1_ps(1.f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

// The largest of x[0..n), -inf for none; NaNs are skipped, as std::fmax skips them. 8 lanes
// at a time: GCC does not inline std::fmax without finite-math flags, and a libm call per
// score was 4% of a 16-row decode step at 1,000-token contexts. Max is exact and order-free,
// so the result is the scalar loop's, bit for bit.
inline float max_of(const float* x, int n) {
  int j = 0;
  float mx = -INFINITY;
  if (n >= 8) {
    __m256 acc = _mm256_set1_ps(-INFINITY);
    // _mm256_max_ps returns its second operand where either is NaN: a NaN score leaves acc.
    for (; j + 8 <= n; j += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + j), acc);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (float l : lanes) mx = std::fmax(mx, l);
  }
  for (; j < n; ++j) mx = std::fmax(mx, x[j]);
  return mx;
}

// Lanes 0-3 = the sums of acc[0..3]'s 8 lanes (pairwise: ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7))).
inline __m128 reduce4(const __m256* acc) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 u = _mm256_hadd_ps(t0, t1);
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

}  // namespace tnd
