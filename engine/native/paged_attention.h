// Paged attention for a few query rows over the engine's fp32 KV cache (split-K, AVX2).
//
// Rows of one sequence that sit next to each other form a segment (a decode is a segment of
// one row; speculative verification k+1 rows). A segment's context is cut into chunks of
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

inline float dot(const float* a, const float* b, int n) {
  if (n % 8 == 0) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    }
    return hsum(acc);
  }
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float w, const float* x, float* y, int n) {
  int i = 0;
  if (n % 8 == 0) {
    const __m256 wv = _mm256_set1_ps(w);
    for (; i < n; i += 8) {
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
  }
  for (; i < n; ++i) y[i] += w * x[i];
}

struct AttnShape {
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
};

// out[r] (num_heads * head_dim floats) for rows r in [0, rows): row r has query q[r] (rows are
// q_stride floats apart), position pos[r] (it sees positions 0..pos[r]) and block table
// tables[r]. k, v: one layer's caches; slot s holds num_kv_heads * head_dim floats.
inline void paged_attention(const AttnShape& sh, const float* q, int q_stride, int rows,
                            const int64_t* pos, const int32_t* const* tables, const float* k,
                            const float* v, float* out, int threads) {
  const int nh = sh.num_heads, hd = sh.head_dim, bs = sh.block_size;
  const int kvsz = sh.num_kv_heads * hd, group = nh / sh.num_kv_heads;
  struct Segment { int first, count, len; };
  std::vector<Segment> segs;
  for (int r = 0; r < rows; ++r) {
    const int len = static_cast<int>(pos[r]) + 1;
    if (!segs.empty() && tables[segs.back().first] == tables[r] &&
        segs.back().first + segs.back().count == r) {
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
        const float* kp = k + (static_cast<size_t>(table[p / bs]) * bs + p % bs) * kvsz;
        for (int i = 0; i < sg.count; ++i) {
          const int r = sg.first + i;
          if (p > pos[r]) continue;  // causal among the segment's rows
          const float* qr = q + static_cast<size_t>(r) * q_stride;
          for (int h = 0; h < nh; ++h) {
            sc[(static_cast<size_t>(i) * nh + h) * n + (p - tk.p0)] =
                dot(qr + h * hd, kp + (h / group) * hd, hd) * sh.scale;
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
        const float* vp = v + (static_cast<size_t>(table[p / bs]) * bs + p % bs) * kvsz;
        for (int lane = 0; lane < lanes; ++lane) {
          const float w = sc[static_cast<size_t>(lane) * n + (p - tk.p0)];
          if (w != 0.f) axpy(w, vp + ((lane % nh) / group) * hd, &po[(tk.part + lane) * hd], hd);
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
