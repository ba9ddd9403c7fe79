// Paged attention for a few query rows over the engine's KV cache (split-K, AVX2): fp32, bf16
// or fp16 (a bf16/fp16 model's own cache dtype; values widened on load), or int8 with one fp32
// scale per head vector (engine/quant/kv_int8.py: hd int8 values, then the scale's 4 bytes;
// k = q * scale).
//
// Rows of one sequence that sit next to each other form a segment (a decode is a segment of
// one row; speculative verification k+1 rows; a prefill chunk several of MAX_SEGMENT_ROWS). A segment's context is cut into chunks of
// whole blocks, one task per (segment, chunk); each task streams its chunk's K then V rows
// once (all heads of a position are contiguous: 768 bytes for SmolLM2) and serves every row
// and head of the segment from them, keeping a partial softmax (max, sum, weighted V). The
// partials are merged at the end. Streaming whole positions keeps the hardware prefetcher
// busy; reading one head at a time ran at ~2 GB/s, latency-bound. The query heads of a GQA
// group (up to three at a time) share each K and V vector's load and widening; the AVX-512
// build does those loops on 512-bit registers. A SmolLM2 layer (9 heads on 3 KV heads, one
// thread, 1-32 rows, 37-1,000 positions) took, against one head at a time: fp16 cache
// 0.84-1.03x (AVX2; same outputs bit for bit) and 0.75-0.89x (AVX-512), fp32 cache 0.87-1.11x.
// A segment of TILE_MIN_ROWS or more rows (a prefill chunk) widens its task's K and V to fp32
// once and runs scores and weighted V as register tiles (attention_tiles.h): 1.5-1.6x these
// loops on a 512- or 2,048-row chunk (AVX2, SmolLM2's shapes, fp16 cache, 1 and 2 threads).
// tests/unit/engine/native/test_paged_attention.py checks every group shape and cache format
// against a scalar softmax.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_tiles.h"
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

// The AVX-512 build (the avx512 variant's flags) runs the GQA-shared loops on 512-bit
// registers: half the multiply-adds and loads of the 256-bit ones.
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

// sum_i a[i] * b[i], b fp32, int8, bf16 or fp16.
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

// y += w * x, x fp32, int8, bf16 or fp16.
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

// How the cache holds K/V (Step::kv_format in decode_step.cpp).
enum KVFormat : int { KV_F32 = 0, KV_I8 = 1, KV_BF16 = 2, KV_F16 = 3 };

template <int F> struct KVElem { using T = float; };
template <> struct KVElem<KV_I8> { using T = int8_t; };
template <> struct KVElem<KV_BF16> { using T = bf16; };
template <> struct KVElem<KV_F16> { using T = f16; };

// One head vector of a cache slot: fp32, bf16 or fp16 values, or int8 values followed by
// their fp32 scale.
template <int F>
struct KVHead {
  using T = typename KVElem<F>::T;
  static constexpr bool Int8 = F == KV_I8;
  static constexpr int bytes(int hd) {
    return Int8 ? hd + 4 : hd * static_cast<int>(sizeof(T));
  }
  static const T* vals(const uint8_t* p) { return reinterpret_cast<const T*>(p); }
  static float dot(const float* q, const uint8_t* k, int hd) {
    if constexpr (Int8) {
      float scale;
      std::memcpy(&scale, k + hd, sizeof(float));
      return tnd::dot(q, vals(k), hd) * scale;
    } else {
      return tnd::dot(q, vals(k), hd);
    }
  }
  static float scale_of(const uint8_t* k, int hd) {
    float scale = 1.f;
    if constexpr (Int8) std::memcpy(&scale, k + hd, sizeof(float));
    return scale;
  }
  static __m256 load(const uint8_t* k, int d) { return load8(vals(k) + d); }
#if TND_ATTN_512
  static __m512 load_wide(const uint8_t* k, int d) { return load16(vals(k) + d); }
#endif
  // s[g] lane j = q[g] . k[j] for G query heads that share one KV head, over 4 positions
  // (hd % 8 == 0): each K vector is loaded and widened once for all G heads (GQA); each
  // score's products and sums are those of one head at a time.
  template <int G>
  static void dot4_shared(const float* const* q, const uint8_t* const* k, int hd, __m128* s) {
#if TND_ATTN_512
    if (hd % 16 == 0) {
      __m512 wide[G][4];
      for (int g = 0; g < G; ++g) {
        for (int j = 0; j < 4; ++j) wide[g][j] = _mm512_setzero_ps();
      }
      for (int d = 0; d < hd; d += 16) {
        for (int j = 0; j < 4; ++j) {
          const __m512 kv = load_wide(k[j], d);
          for (int g = 0; g < G; ++g) wide[g][j] = _mm512_fmadd_ps(_mm512_loadu_ps(q[g] + d), kv, wide[g][j]);
        }
      }
      for (int g = 0; g < G; ++g) {
        __m256 half[4];
        for (int j = 0; j < 4; ++j) {
          half[j] = _mm256_add_ps(_mm512_castps512_ps256(wide[g][j]),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wide[g][j]), 1)));
        }
        s[g] = reduce4(half);
      }
      scale_scores<G>(k, hd, s);
      return;
    }
#endif
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g) {
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
    }
    for (int d = 0; d < hd; d += 8) {
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = load(k[j], d);
        for (int g = 0; g < G; ++g) acc[g][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d), kv, acc[g][j]);
      }
    }
    for (int g = 0; g < G; ++g) s[g] = reduce4(acc[g]);
    scale_scores<G>(k, hd, s);
  }
  // Int8: each position's dot products times its K vector's scale.
  template <int G>
  static void scale_scores(const uint8_t* const* k, int hd, __m128* s) {
    if constexpr (Int8) {
      alignas(16) float sc[4];
      for (int j = 0; j < 4; ++j) sc[j] = scale_of(k[j], hd);
      for (int g = 0; g < G; ++g) s[g] = _mm_mul_ps(s[g], _mm_load_ps(sc));
    }
  }
  // o[g] += sum_j w[g][j] * v[j] for G query heads sharing one KV head, over nb positions
  // (hd % 32 == 0): each V vector is loaded and widened once for all G heads. A head skips a
  // position its weight is 0 at (masked: the slot may hold anything), as axpy callers do;
  // each output's sum runs over the positions in the same order as one head at a time.
  template <int G>
  static void accumulate_shared(const float* const* w, const uint8_t* const* v, int nb, int hd,
                                float* const* o) {
    int d0 = 0;
#if TND_ATTN_512
    for (; hd % 64 == 0 && d0 < hd; d0 += 64) {
      __m512 acc[G][4];
      for (int g = 0; g < G; ++g) {
        for (int u = 0; u < 4; ++u) acc[g][u] = _mm512_loadu_ps(o[g] + d0 + 16 * u);
      }
      for (int j = 0; j < nb; ++j) {
        bool all = true, none = true;
        for (int g = 0; g < G; ++g) (w[g][j] != 0.f ? none : all) = false;
        if (none) continue;
        const float s = scale_of(v[j], hd);
        __m512 wg[G];
        for (int g = 0; g < G; ++g) wg[g] = _mm512_set1_ps(w[g][j] * s);
        if (all) {
          for (int u = 0; u < 4; ++u) {
            const __m512 x = load_wide(v[j], d0 + 16 * u);
            for (int g = 0; g < G; ++g) acc[g][u] = _mm512_fmadd_ps(wg[g], x, acc[g][u]);
          }
        } else {
          for (int g = 0; g < G; ++g) {
            if (w[g][j] == 0.f) continue;
            for (int u = 0; u < 4; ++u) acc[g][u] = _mm512_fmadd_ps(wg[g], load_wide(v[j], d0 + 16 * u), acc[g][u]);
          }
        }
      }
      for (int g = 0; g < G; ++g) {
        for (int u = 0; u < 4; ++u) _mm512_storeu_ps(o[g] + d0 + 16 * u, acc[g][u]);
      }
    }
#endif
    for (; d0 < hd; d0 += 32) {
      __m256 acc[G][4];
      for (int g = 0; g < G; ++g) {
        for (int u = 0; u < 4; ++u) acc[g][u] = _mm256_loadu_ps(o[g] + d0 + 8 * u);
      }
      for (int j = 0; j < nb; ++j) {
        bool all = true, none = true;
        for (int g = 0; g < G; ++g) (w[g][j] != 0.f ? none : all) = false;
        if (none) continue;
        const float s = scale_of(v[j], hd);
        if (all) {
          __m256 wg[G];
          for (int g = 0; g < G; ++g) wg[g] = _mm256_set1_ps(w[g][j] * s);
          for (int u = 0; u < 4; ++u) {
            const __m256 x = load(v[j], d0 + 8 * u);
            for (int g = 0; g < G; ++g) acc[g][u] = _mm256_fmadd_ps(wg[g], x, acc[g][u]);
          }
        } else {
          for (int g = 0; g < G; ++g) {
            if (w[g][j] == 0.f) continue;
            const __m256 wg = _mm256_set1_ps(w[g][j] * s);
            for (int u = 0; u < 4; ++u) acc[g][u] = _mm256_fmadd_ps(wg, load(v[j], d0 + 8 * u), acc[g][u]);
          }
        }
      }
      for (int g = 0; g < G; ++g) {
        for (int u = 0; u < 4; ++u) _mm256_storeu_ps(o[g] + d0 + 8 * u, acc[g][u]);
      }
    }
  }
  static void axpy(float w, const uint8_t* v, float* y, int hd) {
    if constexpr (Int8) {
      float scale;
      std::memcpy(&scale, v + hd, sizeof(float));
      tnd::axpy(w * scale, vals(v), y, hd);
    } else {
      tnd::axpy(w, vals(v), y, hd);
    }
  }
};

// Store one head vector into a slot: fp32 as is; bf16 and fp16 rounded as torch rounds (to
// nearest even); int8 exactly as engine/quant/kv_int8.py's quantize_heads
// (scale = max(amax / 127, 1e-12), q = round-half-even(x / scale)).
template <int F>
inline void store_head(const float* x, int hd, uint8_t* dst) {
  if constexpr (F == KV_I8) {
    float amax = 0.f;
    for (int i = 0; i < hd; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = std::fmax(amax / 127.f, 1e-12f);
    int8_t* q = reinterpret_cast<int8_t*>(dst);
    for (int i = 0; i < hd; ++i) {
      q[i] = static_cast<int8_t>(std::fmin(127.f, std::fmax(-127.f, std::nearbyint(x[i] / scale))));
    }
    std::memcpy(dst + hd, &scale, sizeof(float));
  } else if constexpr (F == KV_BF16 || F == KV_F16) {
    for (int i = 0; i < hd; ++i) {
      const uint16_t h = F == KV_BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
      std::memcpy(dst + 2 * i, &h, sizeof(h));
    }
  } else {
    std::memcpy(dst, x, static_cast<size_t>(hd) * sizeof(float));
  }
}

// A task's K and V for the tiles (attention_tiles.h), widened to fp32 (int8 times its
// scale): kt, per KV head, (n + 15) / 16 panels of [hd][16] (positions past n zero); vt, per
// KV head, [n][hd]. slot(j) is position p0 + j's slot. False if a V value is not finite: a
// masked weight of 0 would not hide it there, so the task keeps the row-at-a-time loops.
template <int F, class Slot>
inline bool widen_for_tiles(const uint8_t* k, const uint8_t* v, Slot&& slot, int n, int nkv,
                            int hd, float* kt, float* vt) {
  using KV = KVHead<F>;
  const int head_bytes = KV::bytes(hd), panels = (n + TILE_POS - 1) / TILE_POS;
  const size_t per_head_k = static_cast<size_t>(panels) * hd * TILE_POS;
  __m256 bad = _mm256_setzero_ps();
  for (int j = 0; j < n; ++j) {
    const size_t off = slot(j);
    for (int h = 0; h < nkv; ++h) {
      const uint8_t* kh = k + off + static_cast<size_t>(h) * head_bytes;
      const uint8_t* vh = v + off + static_cast<size_t>(h) * head_bytes;
      const __m256 ks = _mm256_set1_ps(KV::scale_of(kh, hd)), vs = _mm256_set1_ps(KV::scale_of(vh, hd));
      float* kp = kt + h * per_head_k + static_cast<size_t>(j / TILE_POS) * hd * TILE_POS + j % TILE_POS;
      float* vp = vt + (static_cast<size_t>(h) * n + j) * hd;
      for (int d = 0; d < hd; d += 8) {
        alignas(32) float x[8];
        _mm256_store_ps(x, KV::Int8 ? _mm256_mul_ps(KV::load(kh, d), ks) : KV::load(kh, d));
        for (int e = 0; e < 8; ++e) kp[(d + e) * TILE_POS] = x[e];
        const __m256 y = KV::Int8 ? _mm256_mul_ps(KV::load(vh, d), vs) : KV::load(vh, d);
        _mm256_storeu_ps(vp + d, y);
        // finite y: y - y == 0; inf or NaN: NaN, unordered
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(y, y), _mm256_setzero_ps(), _CMP_NEQ_UQ));
      }
    }
  }
  for (int j = n; j < panels * TILE_POS; ++j) {  // the last panel's tail
    for (int h = 0; h < nkv; ++h) {
      float* kp = kt + h * per_head_k + static_cast<size_t>(j / TILE_POS) * hd * TILE_POS + j % TILE_POS;
      for (int d = 0; d < hd; ++d) kp[d * TILE_POS] = 0.f;
    }
  }
  return _mm256_movemask_ps(bad) == 0;
}

// Rows per segment at most: a prefill chunk's rows are cut into segments of this many, so its
// tasks' score buffers stay small (rows x heads x chunk floats) and the threads share them.
constexpr int MAX_SEGMENT_ROWS = 32;

struct AttnShape {
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
};

// Calls f(kv, h0, std::integral_constant<int, G>) for each KV head kv and each run of G <= 3
// of its query heads h0 .. h0 + G - 1 (a GQA group of 3 is one call; of 8, 3 + 3 + 2). Three
// heads' accumulators (12 vectors) plus their operands fit AVX2's 16 registers.
template <class Fn>
inline void for_head_groups(int group, int num_kv_heads, Fn&& f) {
  for (int kv = 0; kv < num_kv_heads; ++kv) {
    for (int g0 = 0; g0 < group; g0 += 3) {
      const int h0 = kv * group + g0;
      switch (std::min(3, group - g0)) {
        case 1: f(kv, h0, std::integral_constant<int, 1>{}); break;
        case 2: f(kv, h0, std::integral_constant<int, 2>{}); break;
        default: f(kv, h0, std::integral_constant<int, 3>{}); break;
      }
    }
  }
}

// out[r] (num_heads * head_dim floats) for rows r in [0, rows): row r has query q[r] (rows are
// q_stride floats apart), position pos[r] (it sees positions 0..pos[r]) and block table
// tables[r]. k, v: one layer's caches; slot s holds num_kv_heads head vectors (KVHead).
template <int F>
inline void paged_attention(const AttnShape& sh, const float* q, int q_stride, int rows,
                            const int64_t* pos, const int32_t* const* tables, const uint8_t* k,
                            const uint8_t* v, float* out, int threads) {
  using KV = KVHead<F>;
  const int nh = sh.num_heads, hd = sh.head_dim, bs = sh.block_size;
  const int head_bytes = KV::bytes(hd), nkv = sh.num_kv_heads, group = nh / nkv;
  const size_t slot_bytes = static_cast<size_t>(sh.num_kv_heads) * head_bytes;
  struct Segment { int first, count, len; };
  std::vector<Segment> segs;
  for (int r = 0; r < rows; ++r) {
    const int len = static_cast<int>(pos[r]) + 1;
    if (!segs.empty() && tables[segs.back().first] == tables[r] &&
        segs.back().first + segs.back().count == r && segs.back().count < MAX_SEGMENT_ROWS) {
      segs.back().count += 1;
      segs.back().len = std::max(segs.back().len, len);
    } else {
      segs.push_back({r, 1, len});
    }
  }
  // Chunks: at least 4 blocks, about `threads` of them per segment.
  struct Task { int seg, p0, p1; size_t part; };
  std::vector<Task> tasks;
  size_t parts = 0;
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    const int len = segs[s].len;
    int chunk = (len + threads - 1) / threads;
    chunk = std::max(4 * bs, (chunk + bs - 1) / bs * bs);
    for (int p0 = 0; p0 < len; p0 += chunk) {
      tasks.push_back({s, p0, std::min(len, p0 + chunk), parts});
      parts += static_cast<size_t>(segs[s].count) * nh;
    }
  }
  // Partial results per (task, row of its segment, head): max, sum, weighted V.
  // (kept by the calling thread between calls, as the tasks' scratch below; references, as
  // inside the parallel region a thread_local name is each pool thread's own)
  static thread_local std::vector<float> kept[3];
  std::vector<float>&pm = kept[0], &pl = kept[1], &po = kept[2];
  if (pm.size() < parts) pm.resize(parts), pl.resize(parts);
  if (po.size() < parts * hd) po.resize(parts * hd);
#pragma omp parallel num_threads(threads)
  {
    // Scratch kept by each pool thread from call to call (a prefill chunk's buffers are
    // megabytes: allocated anew per layer, their pages were faulted in and zeroed each time).
    static thread_local std::vector<float> sc, kt, vt;
    static thread_local std::vector<LaneTile> tiles;
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < static_cast<int>(tasks.size()); ++t) {
      const Task& tk = tasks[t];
      const Segment& sg = segs[tk.seg];
      const int32_t* table = tables[sg.first];
      const int n = tk.p1 - tk.p0, lanes = sg.count * nh;
      sc.assign(static_cast<size_t>(lanes) * n, -INFINITY);
      auto slot_of = [&](int p) {
        return (static_cast<size_t>(table[p / bs]) * bs + p % bs) * slot_bytes;
      };
      // A prefill segment's K and V widened once for its rows' tiles (attention_tiles.h).
      const int panels = (n + TILE_POS - 1) / TILE_POS;
      bool tiled = false;
      if (sg.count >= TILE_MIN_ROWS && hd % TILE_POS == 0) {
        kt.resize(static_cast<size_t>(nkv) * panels * hd * TILE_POS);
        vt.resize(static_cast<size_t>(nkv) * n * hd);
        tiled = widen_for_tiles<F>(k, v, [&](int j) { return slot_of(tk.p0 + j); }, n, nkv, hd,
                                   kt.data(), vt.data());
      }
      if (tiled) {
        for (int kv = 0; kv < nkv; ++kv) {
          lane_tiles(pos + sg.first, sg.count, group, kv, tiles);
          qk_tiles(tiles, q + static_cast<size_t>(sg.first) * q_stride, q_stride, pos + sg.first, nh,
                   hd, kt.data() + static_cast<size_t>(kv) * panels * hd * TILE_POS, tk.p0, n,
                   sh.scale, sc.data());
        }
      } else {
        // Scores, 8 positions at a time: their K rows stay in L1 for every row and head of
        // the segment. The query heads that share a KV head (GQA) take each K vector from one
        // load, 4 positions at a time, and 4 dot products end in one reduction.
        const uint8_t* kb[8];
        for (int p = tk.p0; p < tk.p1; p += 8) {
          const int nb = std::min(8, tk.p1 - p);
          for (int j = 0; j < 8; ++j) kb[j] = k + slot_of(p + std::min(j, nb - 1));
          for (int i = 0; i < sg.count; ++i) {
            const int r = sg.first + i;
            if (p > pos[r]) continue;  // causal among the segment's rows
            const float* qr = q + static_cast<size_t>(r) * q_stride;
            float* row_sc = &sc[static_cast<size_t>(i) * nh * n + (p - tk.p0)];
            if (hd % 8 != 0) {
              for (int h = 0; h < nh; ++h) {
                const int kvh = (h / group) * head_bytes;
                for (int j = 0; j < nb && p + j <= pos[r]; ++j) {
                  row_sc[static_cast<size_t>(h) * n + j] = KV::dot(qr + h * hd, kb[j] + kvh, hd) * sh.scale;
                }
              }
              continue;
            }
            for_head_groups(group, nkv, [&](int kv, int h0, auto gc) {
              constexpr int G = decltype(gc)::value;
              const float* qg[G];
              for (int g = 0; g < G; ++g) qg[g] = qr + (h0 + g) * hd;
              for (int half = 0; half < nb && p + half <= pos[r]; half += 4) {
                const uint8_t* kh[4];
                for (int j = 0; j < 4; ++j) kh[j] = kb[half + j] + kv * head_bytes;
                __m128 s4[G];
                KV::template dot4_shared<G>(qg, kh, hd, s4);
                for (int g = 0; g < G; ++g) {
                  alignas(16) float v4[4];
                  _mm_store_ps(v4, _mm_mul_ps(s4[g], _mm_set1_ps(sh.scale)));
                  float* dst = row_sc + static_cast<size_t>(h0 + g) * n + half;
                  for (int j = 0; j < 4 && half + j < nb && p + half + j <= pos[r]; ++j) dst[j] = v4[j];
                }
              }
            });
          }
        }
      }
      for (int lane = 0; lane < lanes; ++lane) {
        float* s = &sc[static_cast<size_t>(lane) * n];
        float mx = max_of(s, n), sum = 0.f;
        if (mx != -INFINITY) {
          int j = 0;
          __m256 acc = _mm256_setzero_ps();
          const __m256 m8 = _mm256_set1_ps(mx);
          for (; j + 8 <= n; j += 8) {  // exp(-inf - mx) = 0: masked positions drop out
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m8));
            _mm256_storeu_ps(s + j, e);
            acc = _mm256_add_ps(acc, e);
          }
          sum = hsum(acc);
          for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
        } else {
          std::fill(s, s + n, 0.f);
        }
        pm[tk.part + lane] = mx;
        pl[tk.part + lane] = sum;
        std::memset(&po[(tk.part + lane) * hd], 0, hd * sizeof(float));
      }
      if (tiled) {
        for (int kv = 0; kv < nkv; ++kv) {
          lane_tiles(pos + sg.first, sg.count, group, kv, tiles);
          pv_tiles(tiles, sc.data(), nh, hd, vt.data() + static_cast<size_t>(kv) * n * hd, tk.p0, n,
                   &po[tk.part * hd]);
        }
        continue;
      }
      // Weighted V, 16 positions at a time: their V rows stay in L1 while the outputs of the
      // query heads sharing a KV head (32 floats at a time) accumulate in registers, each V
      // vector loaded once for all of them.
      constexpr int PB = 16;
      for (int p = tk.p0; p < tk.p1; p += PB) {
        const int nb = std::min(PB, tk.p1 - p);
        const uint8_t* vslot[PB];  // the positions' slots, for every row and head
        const uint8_t* vb[PB];
        for (int j = 0; j < nb; ++j) vslot[j] = v + slot_of(p + j);
        for (int i = 0; i < sg.count; ++i) {
          const float* row_w = &sc[static_cast<size_t>(i) * nh * n + (p - tk.p0)];
          float* row_o = &po[(tk.part + static_cast<size_t>(i) * nh) * hd];
          if (hd % 32 != 0) {
            for (int h = 0; h < nh; ++h) {
              const int kvh = (h / group) * head_bytes;
              for (int j = 0; j < nb; ++j) {
                const float w = row_w[static_cast<size_t>(h) * n + j];
                if (w != 0.f) KV::axpy(w, vslot[j] + kvh, row_o + h * hd, hd);
              }
            }
            continue;
          }
          for_head_groups(group, nkv, [&](int kv, int h0, auto gc) {
            constexpr int G = decltype(gc)::value;
            for (int j = 0; j < nb; ++j) vb[j] = vslot[j] + kv * head_bytes;
            const float* wg[G];
            float* og[G];
            for (int g = 0; g < G; ++g) {
              wg[g] = row_w + static_cast<size_t>(h0 + g) * n;
              og[g] = row_o + (h0 + g) * hd;
            }
            KV::template accumulate_shared<G>(wg, vb, nb, hd, og);
          });
        }
      }
    }
  }
  // Merge each (row, head)'s chunks: softmax over all of them, exactly.
  std::vector<size_t> first_part(segs.size(), SIZE_MAX);
  std::vector<int> num_parts(segs.size(), 0);
  for (const Task& tk : tasks) {
    first_part[tk.seg] = std::min(first_part[tk.seg], tk.part);
    num_parts[tk.seg] += 1;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (segs.size() > 1)
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    const int lanes = segs[s].count * nh;
    for (int lane = 0; lane < lanes; ++lane) {
      const int r = segs[s].first + lane / nh, h = lane % nh;
      float* o = out + static_cast<size_t>(r) * nh * hd + h * hd;
      float mx = -INFINITY;
      for (int c = 0; c < num_parts[s]; ++c) {
        mx = std::fmax(mx, pm[first_part[s] + static_cast<size_t>(c) * lanes + lane]);
      }
      std::memset(o, 0, hd * sizeof(float));
      float total = 0.f;
      for (int c = 0; c < num_parts[s]; ++c) {
        const size_t i = first_part[s] + static_cast<size_t>(c) * lanes + lane;
        if (pl[i] == 0.f) continue;
        const float f = std::exp(pm[i] - mx);
        total += f * pl[i];
        axpy(f, &po[i * hd], o, hd);
      }
      const float inv = 1.f / total;
      for (int j = 0; j < hd; ++j) o[j] *= inv;
    }
  }
}

}  // namespace tnd
