// Paged attention for a few query rows over the engine's KV cache (split-K, AVX2): fp32, bf16
// or fp16 (a bf16/fp16 model's own cache dtype; values widened on load), int8 with one fp32
// scale per head vector (engine/quant/kv_int8.py: hd int8 values, then the scale's 4 bytes;
// k = q * scale), or fp8 (e4m3 over one scale for K and one for V, engine/quant/kv_fp8.py):
// its values are read times 2^-8 (kv_head.h), and K's scale times 2^8 joins the softmax
// scale of every score, V's the division by the softmax sum of every output, so the loops
// multiply nothing more than for a float cache.
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
// The cache's head vectors (formats, GQA-shared loops, writes) are in kv_head.h, the vector
// helpers in vec_math.h.
// A sliding-window layer (window > 0) lets row r see positions pos[r] - window + 1 .. pos[r]
// only (transformers' semantics): a segment's chunks start at the block holding its first
// row's window start, so blocks before it (freed by the KV cache manager, maybe another
// sequence's by now) are never read, and each row's older positions score -inf.
// tests/unit/engine/native/test_paged_attention.py checks every group shape and cache format
// against a scalar softmax, with and without a window.
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
#include "kv_head.h"
#include "vec_math.h"

namespace tnd {

// Rows per segment at most: a prefill chunk's rows are cut into segments of this many, so its
// tasks' score buffers stay small (rows x heads x chunk floats) and the threads share them.
constexpr int MAX_SEGMENT_ROWS = 32;

struct AttnShape {
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  // An fp8 cache's scales of this layer (x = e4m3 * scale); 1 for the other formats.
  float k_scale = 1.f, v_scale = 1.f;
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
// q_stride floats apart), position pos[r] (it sees positions 0..pos[r], or the last `window`
// of them when window > 0) and block table tables[r]. k, v: one layer's caches; slot s holds
// num_kv_heads head vectors (KVHead).
template <int F>
inline void paged_attention(const AttnShape& sh, const float* q, int q_stride, int rows,
                            const int64_t* pos, const int32_t* const* tables, const uint8_t* k,
                            const uint8_t* v, float* out, int threads, int window = 0) {
  using KV = KVHead<F>;
  const int nh = sh.num_heads, hd = sh.head_dim, bs = sh.block_size;
  const int head_bytes = KV::bytes(hd), nkv = sh.num_kv_heads, group = nh / nkv;
  const size_t slot_bytes = static_cast<size_t>(sh.num_kv_heads) * head_bytes;
  // Scores: q . k as read times this; outputs: the weighted sum of V as read times out_scale
  // / the softmax sum (KV::unread: what a value as read is short of the stored one). They are
  // the softmax scale and 1 but for an fp8 cache.
  const float qk_scale = sh.scale * (sh.k_scale * KV::unread);
  const float out_scale = sh.v_scale * KV::unread;
  // The first position row r sees.
  auto low = [&](int r) { return window > 0 ? std::max<int64_t>(0, pos[r] - window + 1) : 0; };
  // A segment's positions [start, len): start is the block holding its rows' first seen one.
  struct Segment { int first, count, start, len; };
  std::vector<Segment> segs;
  for (int r = 0; r < rows; ++r) {
    const int len = static_cast<int>(pos[r]) + 1;
    const int start = static_cast<int>(low(r) / bs * bs);
    if (!segs.empty() && tables[segs.back().first] == tables[r] &&
        segs.back().first + segs.back().count == r && segs.back().count < MAX_SEGMENT_ROWS) {
      segs.back().count += 1;
      segs.back().len = std::max(segs.back().len, len);
      segs.back().start = std::min(segs.back().start, start);
    } else {
      segs.push_back({r, 1, start, len});
    }
  }
  // Chunks: at least 4 blocks, about `threads` of them per segment.
  struct Task { int seg, p0, p1; size_t part; };
  std::vector<Task> tasks;
  size_t parts = 0;
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    const int len = segs[s].len, start = segs[s].start;
    int chunk = (len - start + threads - 1) / threads;
    chunk = std::max(4 * bs, (chunk + bs - 1) / bs * bs);
    for (int p0 = start; p0 < len; p0 += chunk) {
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
                   qk_scale, sc.data());
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
            if (p + 8 <= low(r)) continue;  // before the row's window: stays -inf
            const float* qr = q + static_cast<size_t>(r) * q_stride;
            float* row_sc = &sc[static_cast<size_t>(i) * nh * n + (p - tk.p0)];
            if (hd % 8 != 0) {
              for (int h = 0; h < nh; ++h) {
                const int kvh = (h / group) * head_bytes;
                for (int j = 0; j < nb && p + j <= pos[r]; ++j) {
                  row_sc[static_cast<size_t>(h) * n + j] = KV::dot(qr + h * hd, kb[j] + kvh, hd) * qk_scale;
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
                  _mm_store_ps(v4, _mm_mul_ps(s4[g], _mm_set1_ps(qk_scale)));
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
        if (window > 0) {  // positions before the row's window drop out
          const int64_t older = std::min<int64_t>(n, low(sg.first + lane / nh) - tk.p0);
          for (int64_t j = 0; j < older; ++j) s[j] = -INFINITY;
        }
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
      const float inv = out_scale / total;
      for (int j = 0; j < hd; ++j) o[j] *= inv;
    }
  }
}

}  // namespace tnd