// One head vector in a slot of the paged KV cache, per cache format: fp32, bf16 or fp16 (a
// bf16/fp16 model's own cache dtype; values widened on load), int8 with one fp32 scale per
// head vector (engine/quant/kv_int8.py: hd int8 values, then the scale's 4 bytes; k = q *
// scale), or fp8: hd e4m3 bytes over one scale per tensor and layer, K's and V's
// (engine/quant/kv_fp8.py: k = e4m3 * k_scale). KVHead<F> reads it (dot products, axpy, and the loops where
// the query heads of a GQA group share each K or V vector's load and widening, 512-bit in the
// AVX-512 build); store_head writes it with the torch path's rounding. An fp8 vector is read
// as its bytes' values times 2^-8 (KVHead::unread; e4m3.h widens them so, exactly): the
// tensor's scale and the 2^8 are applied by paged_attention.h to the scores and to the
// weighted V. paged_attention.h's row-at-a-time loops (decodes, verification) run on these;
// attention_tiles.h widens a prefill task's vectors to fp32 through them.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "e4m3.h"
#include "half.h"
#include "vec_math.h"

namespace tnd {

// How the cache holds K/V (Step::kv_format in decode_step.cpp).
enum KVFormat : int { KV_F32 = 0, KV_I8 = 1, KV_BF16 = 2, KV_F16 = 3, KV_FP8 = 4 };

template <int F> struct KVElem { using T = float; };
template <> struct KVElem<KV_I8> { using T = int8_t; };
template <> struct KVElem<KV_BF16> { using T = bf16; };
template <> struct KVElem<KV_F16> { using T = f16; };
template <> struct KVElem<KV_FP8> { using T = e4m3; };

// One head vector of a cache slot: fp32, bf16, fp16 or e4m3 values, or int8 values followed
// by their fp32 scale.
template <int F>
struct KVHead {
  using T = typename KVElem<F>::T;
  static constexpr bool Int8 = F == KV_I8;
  // A value as read times this is the value stored (before an fp8 cache's layer scale):
  // 2^8 for fp8, read as its bytes' values times 2^-8; 1 for the others.
  static constexpr float unread = F == KV_FP8 ? E4M3_UNWIDEN : 1.f;
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
// (scale = max(amax / 127, 1e-12), q = round-half-even(x / scale)); fp8 exactly as
// engine/quant/kv_fp8.py's quantize_fp8 over the tensor's scale (K's or V's; the other
// formats ignore it): e4m3(clamp(x / tensor_scale, -448, 448)), f32_to_e4m3's saturation
// being that clamp (a NaN stays NaN through both).
template <int F>
inline void store_head(const float* x, int hd, uint8_t* dst, float tensor_scale = 1.f) {
  if constexpr (F == KV_FP8) {
    for (int i = 0; i < hd; ++i) dst[i] = f32_to_e4m3(x[i] / tensor_scale);
  } else if constexpr (F == KV_I8) {
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

}  // namespace tnd
