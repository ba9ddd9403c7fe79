// Register tiles for the attention of a prefill segment (paged_attention.h), on K and V
// widened to fp32 once per task.
//
// A segment of many rows (a prefill chunk's rows of one sequence) serves rows x query heads
// "lanes" from the same K and V vectors. The row-at-a-time loops reload and rewiden each K
// vector for every row and end every 4 scores in a horizontal reduction; here the task's K
// and V are widened once (K transposed into panels of 16 positions: [hd][16] floats), and
// scores and weighted V run as small matrix products, 6 lanes x 16 positions (scores) or
// 6 lanes x 16 outputs (weighted V) in 12 accumulators: 12 multiply-adds per 2 loads and 6
// broadcasts, no reductions. Each score is one multiply-add chain over d = 0..hd-1 and each
// output one over the positions in order, so a lane's result does not depend on the other
// lanes of its tile. widen_for_tiles (at the end) fills the task's fp32 K panels and V rows
// from the cache's head vectors (kv_head.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kv_head.h"

namespace tnd {

constexpr int TILE_POS = 16;   // positions per K panel, outputs per weighted-V tile
constexpr int TILE_LANES = 6;  // query vectors (rows x heads) per tile
// Segments of at least this many rows take the tiles (prefill chunks); decodes and
// speculative verification keep the row-at-a-time loops.
constexpr int TILE_MIN_ROWS = 8;

// Calls f(std::integral_constant<int, L>) for L = lanes (1..TILE_LANES).
template <class Fn>
inline void with_lanes(int lanes, Fn&& f) {
  switch (lanes) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    default: f(std::integral_constant<int, 6>{}); break;
  }
}

// dst[l][0..seen[l]) = scale * the dot products of q[l] (hd floats) with the panel's first
// seen[l] positions (at most 16); kt is a panel [hd][16]. The accumulators are locals: held
// in an array the caller owns, they went through the stack on every step.
template <int L>
inline void qk_tile(const float* const* q, const float* kt, int hd, __m256 scale,
                    float* const* dst, const int* seen) {
  __m256 acc[L][2];
  for (int l = 0; l < L; ++l) acc[l][0] = acc[l][1] = _mm256_setzero_ps();
  for (int d = 0; d < hd; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kt + d * TILE_POS), k1 = _mm256_loadu_ps(kt + d * TILE_POS + 8);
    for (int l = 0; l < L; ++l) {
      const __m256 x = _mm256_broadcast_ss(q[l] + d);
      acc[l][0] = _mm256_fmadd_ps(x, k0, acc[l][0]);
      acc[l][1] = _mm256_fmadd_ps(x, k1, acc[l][1]);
    }
  }
  for (int l = 0; l < L; ++l) {
    if (seen[l] >= TILE_POS) {
      _mm256_storeu_ps(dst[l], _mm256_mul_ps(acc[l][0], scale));
      _mm256_storeu_ps(dst[l] + 8, _mm256_mul_ps(acc[l][1], scale));
    } else if (seen[l] > 0) {
      alignas(32) float tmp[TILE_POS];
      _mm256_store_ps(tmp, _mm256_mul_ps(acc[l][0], scale));
      _mm256_store_ps(tmp + 8, _mm256_mul_ps(acc[l][1], scale));
      std::copy(tmp, tmp + seen[l], dst[l]);
    }
  }
}

// o[l][0..16) += sum_{j < nb} w[l][j] * v[j * v_stride .. + 16), in order of j.
template <int L>
inline void pv_tile(const float* const* w, const float* v, int v_stride, int nb, float* const* o) {
  __m256 acc[L][2];
  for (int l = 0; l < L; ++l) {
    acc[l][0] = _mm256_loadu_ps(o[l]);
    acc[l][1] = _mm256_loadu_ps(o[l] + 8);
  }
  for (int j = 0; j < nb; ++j) {
    const __m256 v0 = _mm256_loadu_ps(v + static_cast<size_t>(j) * v_stride);
    const __m256 v1 = _mm256_loadu_ps(v + static_cast<size_t>(j) * v_stride + 8);
    for (int l = 0; l < L; ++l) {
      const __m256 x = _mm256_broadcast_ss(w[l] + j);
      acc[l][0] = _mm256_fmadd_ps(x, v0, acc[l][0]);
      acc[l][1] = _mm256_fmadd_ps(x, v1, acc[l][1]);
    }
  }
  for (int l = 0; l < L; ++l) {
    _mm256_storeu_ps(o[l], acc[l][0]);
    _mm256_storeu_ps(o[l] + 8, acc[l][1]);
  }
}

// Up to TILE_LANES lanes of one KV head: segment rows and query heads, and the latest
// position any of them sees.
struct LaneTile {
  int count;
  int64_t last;
  int row[TILE_LANES], head[TILE_LANES];
};

// The tiles of KV head kv's lanes in a segment of `rows` rows (positions pos[0..rows)): lane
// l is row l / group with query head kv * group + l % group.
inline void lane_tiles(const int64_t* pos, int rows, int group, int kv, std::vector<LaneTile>& out) {
  out.clear();
  for (int i = 0, g = 0; i < rows;) {
    LaneTile t{0, -1, {}, {}};
    for (; t.count < TILE_LANES && i < rows; ++t.count) {
      t.row[t.count] = i;
      t.head[t.count] = kv * group + g;
      t.last = std::max(t.last, pos[i]);
      if (++g == group) g = 0, ++i;
    }
    out.push_back(t);
  }
}

// Scores of the lanes in `tiles` against the task's positions p0 .. p0 + n - 1:
// sc[(row * num_heads + head) * n + (p - p0)] = scale * q . k[p] for p <= the row's position
// pos[row] (later positions are left as they are: -inf). kt: the KV head's panels,
// (n + 15) / 16 of [hd][16].
inline void qk_tiles(const std::vector<LaneTile>& tiles, const float* q, int q_stride,
                     const int64_t* pos, int num_heads, int hd, const float* kt, int64_t p0,
                     int n, float scale, float* sc) {
  const int panels = (n + TILE_POS - 1) / TILE_POS;
  const __m256 sc8 = _mm256_set1_ps(scale);
  for (int pp = 0; pp < panels; ++pp) {
    const int64_t base = p0 + static_cast<int64_t>(pp) * TILE_POS;
    const float* panel = kt + static_cast<size_t>(pp) * hd * TILE_POS;
    for (const LaneTile& t : tiles) {
      if (base > t.last) continue;  // causal: no lane of this tile sees the panel
      const float* ql[TILE_LANES];
      float* dst[TILE_LANES];
      int seen[TILE_LANES];
      for (int l = 0; l < t.count; ++l) {
        const int i = t.row[l], h = t.head[l];
        ql[l] = q + static_cast<size_t>(i) * q_stride + static_cast<size_t>(h) * hd;
        dst[l] = sc + (static_cast<size_t>(i) * num_heads + h) * n + pp * TILE_POS;
        seen[l] = static_cast<int>(std::min<int64_t>(pos[i] - base + 1, n - pp * TILE_POS));
      }
      with_lanes(t.count, [&](auto lc) { qk_tile<decltype(lc)::value>(ql, panel, hd, sc8, dst, seen); });
    }
  }
}

// Weighted V of the lanes in `tiles`: po[(row * num_heads + head) * hd + d] (zeroed by the
// caller) += sum_p w[p] * v[p][d], w the lane's softmax weights in sc (0 past its row's
// position). vt: the KV head's values [n][hd], all finite (a masked weight of 0 times a
// finite value adds nothing). Positions in blocks of 64 (16 KiB of V per block in L1).
inline void pv_tiles(const std::vector<LaneTile>& tiles, const float* sc, int num_heads, int hd,
                     const float* vt, int64_t p0, int n, float* po) {
  constexpr int BLOCK = 64;
  for (int j0 = 0; j0 < n; j0 += BLOCK) {
    for (const LaneTile& t : tiles) {
      const int nb = static_cast<int>(std::min<int64_t>({BLOCK, n - j0, t.last - p0 - j0 + 1}));
      if (nb <= 0) continue;
      const float* w[TILE_LANES];
      float* o[TILE_LANES];
      for (int l = 0; l < t.count; ++l) {
        const size_t lane = static_cast<size_t>(t.row[l]) * num_heads + t.head[l];
        w[l] = sc + lane * n + j0;
        o[l] = po + lane * hd;
      }
      for (int d0 = 0; d0 < hd; d0 += TILE_POS) {
        float* od[TILE_LANES];
        for (int l = 0; l < t.count; ++l) od[l] = o[l] + d0;
        with_lanes(t.count, [&](auto lc) {
          pv_tile<decltype(lc)::value>(w, vt + static_cast<size_t>(j0) * hd + d0, hd, nb, od);
        });
      }
    }
  }
}

// A task's K and V for the tiles above, widened to fp32 (int8 times its scale; fp8 as read,
// times 2^-8, its tensor scales applied by the caller): kt, per KV head, (n + 15) / 16 panels
// of [hd][16] (positions past n zero); vt, per KV head, [n][hd].
// slot(j) is position p0 + j's slot. False if a V value is not finite: a masked weight of 0
// would not hide it there, so the task keeps the row-at-a-time loops.
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

}  // namespace tnd
