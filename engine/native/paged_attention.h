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
// busy; reading one head at a time ran at ~2 GB/s, latency-bound.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

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

// Lane j of the result = the sum of acc[j]'s 8 lanes.
inline __m256 reduce8(const __m256* acc) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
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
  // q . k[j] for 8 head vectors (hd % 8 == 0), one lane each.
  static __m256 dot8(const float* q, const uint8_t* const* k, int hd) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, load(k[j], d), acc[j]);
    }
    __m256 s = reduce8(acc);
    if constexpr (Int8) {
      alignas(32) float sc[8];
      for (int j = 0; j < 8; ++j) sc[j] = scale_of(k[j], hd);
      s = _mm256_mul_ps(s, _mm256_load_ps(sc));
    }
    return s;
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

// Rows per segment at most: a prefill chunk's rows are cut into segments of this many, so its
// tasks' score buffers stay small (rows x heads x chunk floats) and the threads share them.
constexpr int MAX_SEGMENT_ROWS = 32;

struct AttnShape {
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
};

// out[r] (num_heads * head_dim floats) for rows r in [0, rows): row r has query q[r] (rows are
// q_stride floats apart), position pos[r] (it sees positions 0..pos[r]) and block table
// tables[r]. k, v: one layer's caches; slot s holds num_kv_heads head vectors (KVHead).
template <int F>
inline void paged_attention(const AttnShape& sh, const float* q, int q_stride, int rows,
                            const int64_t* pos, const int32_t* const* tables, const uint8_t* k,
                            const uint8_t* v, float* out, int threads) {
  using KV = KVHead<F>;
  const int nh = sh.num_heads, hd = sh.head_dim, bs = sh.block_size;
  const int head_bytes = KV::bytes(hd), group = nh / sh.num_kv_heads;
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
  std::vector<float> pm(parts), pl(parts), po(parts * hd);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> sc;
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
      // Scores, 8 positions at a time: their K rows stay in L1 for every row and head of
      // the segment, and 8 dot products end in one reduction (not 8 horizontal sums).
      const uint8_t* kb[8];
      for (int p = tk.p0; p < tk.p1; p += 8) {
        const int nb = std::min(8, tk.p1 - p);
        for (int j = 0; j < 8; ++j) kb[j] = k + slot_of(p + std::min(j, nb - 1));
        for (int i = 0; i < sg.count; ++i) {
          const int r = sg.first + i;
          if (p > pos[r]) continue;  // causal among the segment's rows
          const float* qr = q + static_cast<size_t>(r) * q_stride;
          for (int h = 0; h < nh; ++h) {
            float* dst = &sc[(static_cast<size_t>(i) * nh + h) * n + (p - tk.p0)];
            const int kvh = (h / group) * head_bytes;
            if (hd % 8 == 0) {
              const uint8_t* kh[8];
              for (int j = 0; j < 8; ++j) kh[j] = kb[j] + kvh;
              alignas(32) float v8[8];
              _mm256_store_ps(v8, _mm256_mul_ps(KV::dot8(qr + h * hd, kh, hd),
                                                _mm256_set1_ps(sh.scale)));
              for (int j = 0; j < nb && p + j <= pos[r]; ++j) dst[j] = v8[j];
            } else {
              for (int j = 0; j < nb && p + j <= pos[r]; ++j) {
                dst[j] = KV::dot(qr + h * hd, kb[j] + kvh, hd) * sh.scale;
              }
            }
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
      // Weighted V, 16 positions at a time: their V rows stay in L1 while each lane's
      // output (64 floats at a time) accumulates in registers.
      constexpr int PB = 16;
      for (int p = tk.p0; p < tk.p1; p += PB) {
        const int nb = std::min(PB, tk.p1 - p);
        const uint8_t* vb[PB];
        for (int j = 0; j < nb; ++j) vb[j] = v + slot_of(p + j);
        for (int lane = 0; lane < lanes; ++lane) {
          const float* w = &sc[static_cast<size_t>(lane) * n + (p - tk.p0)];
          const int kvh = ((lane % nh) / group) * head_bytes;
          float* o = &po[(tk.part + lane) * hd];
          if (hd % 64 != 0) {
            for (int j = 0; j < nb; ++j) {
              if (w[j] != 0.f) KV::axpy(w[j], vb[j] + kvh, o, hd);
            }
            continue;
          }
          for (int d0 = 0; d0 < hd; d0 += 64) {
            __m256 acc[8];
            for (int u = 0; u < 8; ++u) acc[u] = _mm256_loadu_ps(o + d0 + 8 * u);
            for (int j = 0; j < nb; ++j) {
              if (w[j] == 0.f) continue;
              const uint8_t* vh = vb[j] + kvh;
              const __m256 wj = _mm256_set1_ps(w[j] * KV::scale_of(vh, hd));
              for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(wj, KV::load(vh, d0 + 8 * u), acc[u]);
            }
            for (int u = 0; u < 8; ++u) _mm256_storeu_ps(o + d0 + 8 * u, acc[u]);
          }
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
