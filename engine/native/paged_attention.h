// Paged attention for a few query rows over the engine's KV cache (split-K, AVX2): fp32, or
// int8 with one fp32 scale per head vector (engine/quant/kv_int8.py: hd int8 values, then the
// scale's 4 bytes; k = q * scale).
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

// sum_i a[i] * b[i], b fp32 or int8.
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

// y += w * x, x fp32 or int8.
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

// One head vector of a cache slot: fp32 values, or int8 values followed by their fp32 scale.
template <bool Int8>
struct KVHead {
  static constexpr int bytes(int hd) { return Int8 ? hd + 4 : hd * 4; }
  static float dot(const float* q, const uint8_t* k, int hd) {
    if constexpr (Int8) {
      float scale;
      std::memcpy(&scale, k + hd, sizeof(float));
      return tnd::dot(q, reinterpret_cast<const int8_t*>(k), hd) * scale;
    } else {
      return tnd::dot(q, reinterpret_cast<const float*>(k), hd);
    }
  }
  static void axpy(float w, const uint8_t* v, float* y, int hd) {
    if constexpr (Int8) {
      float scale;
      std::memcpy(&scale, v + hd, sizeof(float));
      tnd::axpy(w * scale, reinterpret_cast<const int8_t*>(v), y, hd);
    } else {
      tnd::axpy(w, reinterpret_cast<const float*>(v), y, hd);
    }
  }
};

// Store one head vector into a slot: fp32 as is; int8 exactly as engine/quant/kv_int8.py's
// quantize_heads (scale = max(amax / 127, 1e-12), q = round-half-even(x / scale)).
template <bool Int8>
inline void store_head(const float* x, int hd, uint8_t* dst) {
  if constexpr (Int8) {
    float amax = 0.f;
    for (int i = 0; i < hd; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = std::fmax(amax / 127.f, 1e-12f);
    int8_t* q = reinterpret_cast<int8_t*>(dst);
    for (int i = 0; i < hd; ++i) {
      q[i] = static_cast<int8_t>(std::fmin(127.f, std::fmax(-127.f, std::nearbyint(x[i] / scale))));
    }
    std::memcpy(dst + hd, &scale, sizeof(float));
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
template <bool Int8>
inline void paged_attention(const AttnShape& sh, const float* q, int q_stride, int rows,
                            const int64_t* pos, const int32_t* const* tables, const uint8_t* k,
                            const uint8_t* v, float* out, int threads) {
  using KV = KVHead<Int8>;
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
      for (int p = tk.p0; p < tk.p1; ++p) {
        const uint8_t* kp = k + (static_cast<size_t>(table[p / bs]) * bs + p % bs) * slot_bytes;
        for (int i = 0; i < sg.count; ++i) {
          const int r = sg.first + i;
          if (p > pos[r]) continue;  // causal among the segment's rows
          const float* qr = q + static_cast<size_t>(r) * q_stride;
          for (int h = 0; h < nh; ++h) {
            sc[(static_cast<size_t>(i) * nh + h) * n + (p - tk.p0)] =
                KV::dot(qr + h * hd, kp + (h / group) * head_bytes, hd) * sh.scale;
          }
        }
      }
      for (int lane = 0; lane < lanes; ++lane) {
        float* s = &sc[static_cast<size_t>(lane) * n];
        float mx = -INFINITY, sum = 0.f;
        for (int j = 0; j < n; ++j) mx = std::fmax(mx, s[j]);
        if (mx != -INFINITY) {
          for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
        } else {
          std::fill(s, s + n, 0.f);
        }
        pm[tk.part + lane] = mx;
        pl[tk.part + lane] = sum;
        std::memset(&po[(tk.part + lane) * hd], 0, hd * sizeof(float));
      }
      for (int p = tk.p0; p < tk.p1; ++p) {
        const uint8_t* vp = v + (static_cast<size_t>(table[p / bs]) * bs + p % bs) * slot_bytes;
        for (int lane = 0; lane < lanes; ++lane) {
          const float w = sc[static_cast<size_t>(lane) * n + (p - tk.p0)];
          if (w != 0.f) {
            KV::axpy(w, vp + ((lane % nh) / group) * head_bytes, &po[(tk.part + lane) * hd], hd);
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
