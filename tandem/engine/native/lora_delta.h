// LoRA deltas inside the fused forward: each row of a step under its own adapter (its "slot"
// in the step) or none, added to a projection's output after the base linear ran:
//
//     y[r, cols_j .. cols_j+1) += Bt_j^T (A_j x[r])     for each sub-projection j of the
//                                                       row's adapter (q | k | v, gate | up)
//
// Rows are grouped by slot once per step (plan_lora) and cut into tiles of up to LORA_TILE
// rows of one slot; a tile is two small GEMMs per sub-projection: shrink (t = A_j x, rank
// dot products per row, each row of A read once for the whole tile) and expand (y += Bt_j^T t,
// LORA_TILE accumulators per 8 output columns, each row of Bt read once for the tile). Tiles
// run on the thread pool; rows without an adapter are never touched. The adapters' weights
// are fp32 (engine/native/lora_step.py widens them once: they are small), activations fp32,
// so the delta is the same whatever kind of weights the base linear reads (GGUF blocks,
// int8/int4, bf16): it is added to that linear's output.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "vec_math.h"

namespace tnd {

// One adapter's delta on one fused projection of one layer. Sub-projection j (of a fused
// projection whose outputs are the column ranges cols[0..n]) has A_j at a + j * rank * in
// ([rank, in]) and B_j^T at bt + rank * cols[j] ([rank, cols[j+1] - cols[j]], the adapter's
// scaling folded in).
struct LoraProj {
  const float* a;  // null: the adapter leaves this projection alone
  const float* bt;
  int32_t rank;
  int32_t subs;  // bit j set: sub-projection j carries a delta (the others are skipped)
};

constexpr int LORA_PROJS = 4;  // per layer: qkv, o, gate_up, down (engine/lora/adapter.py)
constexpr int LORA_MAX_RANK = 512;
constexpr int LORA_TILE = 8;

// A step's adapters (may be absent: no row has one).
struct LoraStep {
  int32_t num_slots;
  const LoraProj* const* slots;  // [num_slots] -> [num_layers * LORA_PROJS] each
  const int32_t* row_slot;       // [rows]: row r's slot, -1 for the base model
};

struct LoraTile {
  int32_t slot, first, count;  // rows plan.rows[first .. first + count), all under slot
};

struct LoraPlan {
  std::vector<int32_t> rows;  // the adapted rows, grouped by slot
  std::vector<LoraTile> tiles;
};

// Groups the step's adapted rows by slot into tiles; false when a row's slot is out of range
// or a slot's projection has a rank above LORA_MAX_RANK (nothing planned).
inline bool plan_lora(const LoraStep& ls, int rows, int num_layers, LoraPlan& plan) {
  plan.rows.clear();
  plan.tiles.clear();
  if (ls.num_slots < 0 || (ls.num_slots > 0 && ls.slots == nullptr)) return false;
  for (int s = 0; s < ls.num_slots; ++s) {
    for (int i = 0; i < num_layers * LORA_PROJS; ++i) {
      const LoraProj& p = ls.slots[s][i];
      if (p.a && (p.rank < 1 || p.rank > LORA_MAX_RANK || !p.bt)) return false;
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (ls.row_slot[r] < -1 || ls.row_slot[r] >= ls.num_slots) return false;
  }
  for (int s = 0; s < ls.num_slots; ++s) {
    const int start = static_cast<int>(plan.rows.size());
    for (int r = 0; r < rows; ++r) {
      if (ls.row_slot[r] == s) plan.rows.push_back(r);
    }
    const int end = static_cast<int>(plan.rows.size());
    for (int i = start; i < end; i += LORA_TILE) plan.tiles.push_back({s, i, std::min(LORA_TILE, end - i)});
  }
  return true;
}

// t[m * rank + k] = a[k] . x[m] for the M rows x[0..M) (any ``in``: an FP8 layer's input
// width need not be a multiple of 8; the last in % 8 inputs are summed one at a time).
template <int M>
inline void lora_shrink(const float* a, int rank, int in, const float* const* x, float* t) {
  const int whole = in & ~7;
  for (int k = 0; k < rank; ++k) {
    const float* ak = a + static_cast<size_t>(k) * in;
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int i = 0; i < whole; i += 8) {
      const __m256 av = _mm256_loadu_ps(ak + i);
      for (int m = 0; m < M; ++m) acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x[m] + i), av, acc[m]);
    }
    for (int m = 0; m < M; ++m) {
      float sum = hsum(acc[m]);
      for (int i = whole; i < in; ++i) sum += ak[i] * x[m][i];
      t[m * rank + k] = sum;
    }
  }
}

// y[m][0 .. out) += sum_k t[m * rank + k] * bt[k, 0 .. out) for the M rows y[0..M).
template <int M>
inline void lora_expand(const float* bt, int rank, int out, const float* t, float* const* y) {
  int o = 0;
  for (; o + 8 <= out; o += 8) {
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_loadu_ps(y[m] + o);
    for (int k = 0; k < rank; ++k) {
      const __m256 bv = _mm256_loadu_ps(bt + static_cast<size_t>(k) * out + o);
      for (int m = 0; m < M; ++m) acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(t[m * rank + k]), bv, acc[m]);
    }
    for (int m = 0; m < M; ++m) _mm256_storeu_ps(y[m] + o, acc[m]);
  }
  for (; o < out; ++o) {
    for (int m = 0; m < M; ++m) {
      float s = y[m][o];
      for (int k = 0; k < rank; ++k) s += t[m * rank + k] * bt[static_cast<size_t>(k) * out + o];
      y[m][o] = s;
    }
  }
}

template <int M>
inline void lora_tile_m(const LoraProj& p, const int32_t* rows, const float* x, int ldx, int in,
                        float* y, int ldy, const int* cols, int nsub) {
  float t[M * LORA_MAX_RANK];
  const float* xr[M];
  float* yr[M];
  for (int m = 0; m < M; ++m) xr[m] = x + static_cast<size_t>(rows[m]) * ldx;
  for (int j = 0; j < nsub; ++j) {
    if (!(p.subs >> j & 1)) continue;
    for (int m = 0; m < M; ++m) yr[m] = y + static_cast<size_t>(rows[m]) * ldy + cols[j];
    lora_shrink<M>(p.a + static_cast<size_t>(j) * p.rank * in, p.rank, in, xr, t);
    lora_expand<M>(p.bt + static_cast<size_t>(p.rank) * cols[j], p.rank, cols[j + 1] - cols[j], t, yr);
  }
}

inline void lora_tile(const LoraProj& p, const int32_t* rows, int count, const float* x, int ldx,
                      int in, float* y, int ldy, const int* cols, int nsub) {
  switch (count) {
    case 1: lora_tile_m<1>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 2: lora_tile_m<2>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 3: lora_tile_m<3>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 4: lora_tile_m<4>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 5: lora_tile_m<5>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 6: lora_tile_m<6>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    case 7: lora_tile_m<7>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
    default: lora_tile_m<8>(p, rows, x, ldx, in, y, ldy, cols, nsub); break;
  }
}

// y (rows of ldy) += each adapted row's delta of projection `proj` of `layer`, from x (rows
// of ldx, `in` wide); cols[0..nsub]: the sub-projections' output column ranges.
inline void lora_delta(const LoraStep& ls, const LoraPlan& plan, int layer, int proj,
                       const float* x, int ldx, int in, float* y, int ldy, const int* cols,
                       int nsub, int threads) {
  const int n = static_cast<int>(plan.tiles.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (n > 1)
  for (int i = 0; i < n; ++i) {
    const LoraTile& tile = plan.tiles[i];
    const LoraProj& p = ls.slots[tile.slot][layer * LORA_PROJS + proj];
    if (p.a) lora_tile(p, plan.rows.data() + tile.first, tile.count, x, ldx, in, y, ldy, cols, nsub);
  }
}

}  // namespace tnd
