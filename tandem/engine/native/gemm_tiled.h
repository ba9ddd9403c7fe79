// Linear layers for many activation rows (batched decodes, prefill chunks), AVX2 + FMA; the
// AVX-512 build (TND_AVX512) runs a 12 x 16 micro-kernel on 512-bit registers instead.
//
//   threads split the weight rows into panels of 16; for each panel and window of 256 inputs:
//     the 16 x 256 weights as fp32, laid out [256][16] (16 KB: L1; panel_dequant.h)
//     for every 6 activation rows: 6 x 16 outputs in 12 accumulators, one panel row (two
//       vectors) and six broadcast activations per input: 12 FMAs per 8 loads
//
// Each weight is read from memory once per step and turned into a float once, so the cost is
// the FMAs, not the unpacking (the few-row path of linear_rows.h instead spends ~7 integer
// ops per group of 32 per row). Activations stay fp32 here (no int16 rounding), so these
// products are closer to the dequantized model than the few-row path's.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "linear_rows.h"
#include "panel_dequant.h"
#include "quant_linear.h"

namespace tnd {

#if TND_AVX512
constexpr int MICRO_M = 12;   // activation rows per micro-kernel call: 12 512-bit accumulators
#else
constexpr int MICRO_M = 6;    // activation rows per micro-kernel call: 12 accumulators
#endif

// c[i][0..16) (+)= sum_k x[i][k] * panel[k][0..16) for i < MR: one weight panel row (two
// vectors) per k, broadcast activations; 12 FMAs per 8 loads.
template <int MR>
inline void micro_panel(const float* x, int ldx, const float* panel, int kc, float* y, int ldy,
                        int nr, bool add) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(panel + k * PANEL_N);
    const __m256 b1 = _mm256_load_ps(panel + k * PANEL_N + 8);
#pragma GCC unroll 8  // unrolled, the accumulators stay in registers (else GCC spills them)
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + static_cast<size_t>(i) * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* out = y + static_cast<size_t>(i) * ldy;
    if (nr == PANEL_N) {
      if (add) {
        acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(out));
        acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(out + 8));
      }
      _mm256_storeu_ps(out, acc[i][0]);
      _mm256_storeu_ps(out + 8, acc[i][1]);
    } else {
      alignas(32) float v[PANEL_N];
      _mm256_store_ps(v, acc[i][0]);
      _mm256_store_ps(v + 8, acc[i][1]);
      for (int j = 0; j < nr; ++j) out[j] = add ? out[j] + v[j] : v[j];
    }
  }
}

#if TND_AVX512
// micro_panel with one 512-bit panel row per k (the 16 outputs in one register) and up to 12
// rows: 12 FMAs per 13 loads, each 16 wide. Every output lane sums its products in the same
// order as micro_panel's, so the two builds' tiled results are bit-identical.
template <int MR>
inline void micro_panel512(const float* x, int ldx, const float* panel, int kc, float* y,
                           int ldy, int nr, bool add) {
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 b = _mm512_load_ps(panel + k * PANEL_N);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[static_cast<size_t>(i) * ldx + k]), b, acc[i]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>(nr >= PANEL_N ? 0xFFFF : (1u << nr) - 1);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* out = y + static_cast<size_t>(i) * ldy;
    if (add) acc[i] = _mm512_add_ps(acc[i], _mm512_maskz_loadu_ps(mask, out));
    _mm512_mask_storeu_ps(out, mask, acc[i]);
  }
}
#endif

// The micro-kernel of this build for MR rows.
template <int MR>
inline void micro(const float* x, int ldx, const float* panel, int kc, float* y, int ldy, int nr,
                  bool add) {
#if TND_AVX512
  micro_panel512<MR>(x, ldx, panel, kc, y, ldy, nr, add);
#else
  micro_panel<MR>(x, ldx, panel, kc, y, ldy, nr, add);
#endif
}

// A tail block of rem (< MR + 1) rows with the kernel for exactly that many (none for 0).
template <int MR>
inline void micro_tail(int rem, const float* x, int ldx, const float* panel, int kc, float* y,
                       int ldy, int nr, bool add) {
  if constexpr (MR > 0) {
    if (rem == MR) {
      micro<MR>(x, ldx, panel, kc, y, ldy, nr, add);
    } else {
      micro_tail<MR - 1>(rem, x, ldx, panel, kc, y, ldy, nr, add);
    }
  }
}

// Rows a micro-kernel call needs to run at full speed: fewer, and each input's FMAs wait on
// the previous ones' latency (4 cycles on 2 ports: 8 independent accumulators, two per row
// in the AVX2 kernel, one in the 512-bit one).
#if TND_AVX512
constexpr int MICRO_FULL = 8;
#else
constexpr int MICRO_FULL = 4;
#endif

// How `rows` are cut into micro-kernel calls: `full` of MICRO_M rows, then tail_a and tail_b.
// A remainder too small to run at full speed is merged with the last full block and the
// two split evenly (AVX2, 32 rows: 6+6+6+6+4+4, not 6+6+6+6+6+2). Each row's outputs are
// summed in the same order whatever its block, so the cut never changes a result.
struct RowBlocks {
  int full, tail_a, tail_b;
};

inline RowBlocks row_blocks(int rows) {
  RowBlocks b{rows / MICRO_M, rows % MICRO_M, 0};
  if (b.tail_a != 0 && b.tail_a < MICRO_FULL && b.full > 0) {
    const int merged = MICRO_M + b.tail_a;
    b.full -= 1;
    b.tail_a = (merged + 1) / 2;
    b.tail_b = merged - b.tail_a;
  }
  return b;
}

template <int Kind>
void linear_tiled_kind(const Lin& w, const float* x, int rows, float* y, int ldy, bool accumulate,
                       int threads) {
  const int k = w.k, panels = (w.n + PANEL_N - 1) / PANEL_N;
  const RowBlocks blocks = row_blocks(rows);
#pragma omp parallel num_threads(threads)
  {
    alignas(32) float rowbuf[PANEL_N * PANEL_K];  // 16 weight rows of one k window
    alignas(64) float panel[PANEL_K * PANEL_N];   // the same, transposed: [k][16]
    // Panels are handed out one at a time, not split up front: on a machine whose cores
    // other processes share (a prefill worker beside a decode worker), a thread the kernel
    // preempts then holds up one panel instead of half the layer while its partners wait at
    // the barrier. Each panel is computed by one thread either way, so results do not depend
    // on the schedule.
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < panels; ++t) {
      const int n0 = t * PANEL_N, nr = std::min(PANEL_N, w.n - n0);
      for (int k0 = 0; k0 < k; k0 += PANEL_K) {
        const int kc = std::min(PANEL_K, k - k0);
        fill_panel<Kind>(w, n0, nr, k0, kc, rowbuf, panel);
        const bool add = accumulate || k0 > 0;
        const float* xk = x + k0;
        float* yt = y + n0;
        int r = 0;
        for (int b = 0; b < blocks.full; ++b, r += MICRO_M) {
          micro<MICRO_M>(xk + static_cast<size_t>(r) * k, k, panel, kc,
                         yt + static_cast<size_t>(r) * ldy, ldy, nr, add);
        }
        for (const int tail : {blocks.tail_a, blocks.tail_b}) {
          micro_tail<MICRO_M - 1>(tail, xk + static_cast<size_t>(r) * k, k, panel, kc,
                                  yt + static_cast<size_t>(r) * ldy, ldy, nr, add);
          r += tail;
        }
      }
      if (w.bias) {
        for (int r = 0; r < rows; ++r) {
          for (int j = 0; j < nr; ++j) y[static_cast<size_t>(r) * ldy + n0 + j] += w.bias[n0 + j];
        }
      }
    }
  }
}

// Rows per pass of linear_tiled_kind. A pass streams every panel's window of 256 inputs
// against all its rows' activations (rows KiB); past ~256 rows that no longer stays in L2
// from one panel to the next: SmolLM2's linears, 2 threads, 2,048 rows in one pass took 3.79 s
// against 2.87 s in passes of 256 (128 and 512 rows: 2.90 s); 512 rows 0.71 against 0.69 s.
// Each panel's weights are unpacked once per pass (a few % of the pass at 256 rows), and a
// row's outputs are summed in the same order in any pass.
constexpr int TILED_ROW_PASS = 256;

inline void linear_tiled(const Lin& w, const float* x, int rows, float* y, int ldy,
                         bool accumulate, int threads) {
  if (rows > TILED_ROW_PASS) {
    for (int r = 0; r < rows; r += TILED_ROW_PASS) {
      linear_tiled(w, x + static_cast<size_t>(r) * w.k, std::min(TILED_ROW_PASS, rows - r),
                   y + static_cast<size_t>(r) * ldy, ldy, accumulate, threads);
    }
    return;
  }
  switch (w.kind) {
    case 0: linear_tiled_kind<0>(w, x, rows, y, ldy, accumulate, threads); break;
    case 1: linear_tiled_kind<1>(w, x, rows, y, ldy, accumulate, threads); break;
    case 2: linear_tiled_kind<2>(w, x, rows, y, ldy, accumulate, threads); break;
    case 4: linear_tiled_kind<4>(w, x, rows, y, ldy, accumulate, threads); break;
    case 5: linear_tiled_kind<5>(w, x, rows, y, ldy, accumulate, threads); break;
    case 6: linear_tiled_kind<6>(w, x, rows, y, ldy, accumulate, threads); break;
    case 7: linear_tiled_kind<7>(w, x, rows, y, ldy, accumulate, threads); break;
    default: linear_tiled_kind<3>(w, x, rows, y, ldy, accumulate, threads); break;
  }
}

// Row n of an embedding table stored as a Lin (any kind) as `k` floats.
inline void lin_row(const Lin& w, int64_t n, float* dst) {
  const int row = static_cast<int>(n), g = w.k / QK;
  switch (w.kind) {
    case 0: dequant_groups<0>(w, row, 0, g, dst); break;
    case 1: dequant_groups<1>(w, row, 0, g, dst); break;
    case 2: dequant_groups<2>(w, row, 0, g, dst); break;
    case 4: dequant_groups<4>(w, row, 0, g, dst); break;
    case 5: dequant_groups<5>(w, row, 0, g, dst); break;
    case 6: dequant_groups<6>(w, row, 0, g, dst); break;
    case 7: dequant_fp8(w, row, 0, w.k, dst); break;  // any K
    default: dequant_groups<3>(w, row, 0, g, dst); break;
  }
}

}  // namespace tnd

namespace tnd {

// Rows from which a linear layer takes the tiled fp32 path (set from bench/native_rows.py).
constexpr int TILED_MIN_ROWS = 8;

// y [rows, N] (+)= x [rows, K] . w^T (+ bias): the small-row integer loops or the tiled path.
inline void linear(const Lin& w, const float* x, int rows, QuantRows& scratch, float* y, int ldy,
                   bool accumulate, int threads) {
  if (rows >= TILED_MIN_ROWS) {
    linear_tiled(w, x, rows, y, ldy, accumulate, threads);
  } else {
    linear_rows(w, x, rows, scratch, y, ldy, accumulate, threads);
  }
}

}  // namespace tnd
