// A linear layer for a few activation rows (decodes, speculative verification): quantizes the
// activations once (unless the weights are floats or FP8), then picks the loop for the weight kind
// and the row count (dot_rows.h, dot_rows512.h) and splits the output rows over OpenMP
// threads. Steps of 8 or more rows take the tiled GEMM instead (gemm_tiled.h's linear()).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "dot_rows.h"
#include "dot_rows512.h"
#include "fp8_weights.h"
#include "quant_linear.h"

namespace tnd {

// out[i] = w[n] . x[r0 + i] for i < cnt (1-4 rows): the loop for this kind and row count.
template <int Kind>
inline void dot_block(const Lin& w, int n, const float* xf, const QuantRows& x, int r0, int cnt,
                      float* out) {
  if constexpr (Kind == KIND_FP8) {
    switch (cnt) {
      case 1: dot_rows_fp8<1>(w, n, xf, w.k, r0, out); break;
      case 2: dot_rows_fp8<2>(w, n, xf, w.k, r0, out); break;
      case 3: dot_rows_fp8<3>(w, n, xf, w.k, r0, out); break;
      default: dot_rows_fp8<4>(w, n, xf, w.k, r0, out); break;
    }
  } else if constexpr (float_kind(Kind)) {
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
    case 7: linear_kind<7>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
    default: linear_kind<3>(w, x, scratch, rows, y, ldy, accumulate, threads); break;
  }
}

}  // namespace tnd
