// The mixture-of-experts feed-forward of one decoder layer in the fused forward
// (decode_step.cpp), computing what engine/models/layers/moe.py computes for the softmax
// routers (Mixtral, Qwen2-MoE, Qwen3-MoE):
//
//   xn [R, H] --router (a float Lin, [E, H])--> logits [R, E]
//     --softmax, the k best (renormalised to sum to one when norm_topk_prob)--> per row
//       k experts and their weights
//   the R x k (row, expert) slots sorted by expert, row order within (a counting sort):
//       e0 e0 e0 | e2 | e5 e5 ...
//   each active expert e, its n_e rows gathered [n_e, H]:
//       --gate_up[e]--> [n_e, 2I] --silu(g) * u--> [n_e, I] --down[e]--> y [n_e, H]
//       h[row] += weight * y                       (a row meets an expert at most once)
//   shared expert (Qwen2-MoE): h += sigmoid(xn . shared_gate) * down(silu(g) * u), over all rows
//
// Each active expert's weights are read once a step for all the rows routed to it: one
// tnd::linear call over its n_e rows, which picks the few-row integer loops or the tiled GEMM
// by n_e, as for a dense linear. The experts' Lins are any kind the dense MLP takes (GGUF
// Q4_0/Q4_1/Q8_0 blocks, int4/int8, fp32/bf16/fp16 read in place). A row's expert outputs
// are added in expert order, as the torch path's index_add adds them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_tiled.h"
#include "quant_linear.h"
#include "vec_math.h"

namespace tnd {

struct MoeLayer {
  int32_t num_experts, top_k, inter;  // routed experts, experts per row, each one's width
  int32_t norm_topk_prob;             // nonzero: the k weights renormalised to sum to one
  Lin router;                         // [E, H], a float kind (never quantized)
  const Lin* gate_up;                 // [E] of [2 inter, H]: gate rows, then up rows
  const Lin* down;                    // [E] of [H, inter]
  int32_t shared_inter;               // the always-on shared expert's width; 0: none
  Lin shared_gate_up, shared_down;    // when shared_inter > 0
  const float* shared_gate;           // [H] fp32: sigmoid(x . w) scales the shared expert;
                                      // null: unscaled
};

// One row's k experts, best first (the lower id on equal logits), and their weights: softmax
// probabilities over all E experts, renormalised over the k when `norm`. The k best logits
// are the k best probabilities, so the softmax is only evaluated for the chosen ones.
inline void route_softmax_topk(const float* logits, int E, int k, bool norm, int32_t* ids,
                               float* w) {
  float mx = logits[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += std::exp(logits[e] - mx);
  float chosen = 0.f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || logits[e] > logits[best]) best = e;
    }
    ids[j] = best;
    w[j] = std::exp(logits[best] - mx) / sum;
    chosen += w[j];
  }
  if (norm) {
    for (int j = 0; j < k; ++j) w[j] /= chosen;
  }
}

// The step's activations and bookkeeping, kept by the calling thread from step to step and
// grown as needed (as decode_step.cpp keeps its own).
struct MoeScratch {
  std::vector<float> logits, weights, xs, gu, act, ys;
  std::vector<int32_t> ids, order, start, cursor;
};

inline void grow_to(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// silu(gate) * up for `rows` rows of [gate (I) | up (I)] into act [rows, I].
inline void gated_rows(const float* gu, int rows, int I, float* act, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= TILED_MIN_ROWS)
  for (int r = 0; r < rows; ++r) {
    const float* g = gu + static_cast<size_t>(r) * 2 * I;
    silu_mul(g, g + I, act + static_cast<size_t>(r) * I, I);
  }
}

// The shared expert over all rows, added to h.
inline void moe_shared(const MoeLayer& m, const float* xn, int rows, int H, float* h,
                       QuantRows& xq, MoeScratch& s, int threads) {
  const int SI = m.shared_inter;
  const size_t R = static_cast<size_t>(rows);
  grow_to(s.gu, R * 2 * SI), grow_to(s.act, R * SI);
  linear(m.shared_gate_up, xn, rows, xq, s.gu.data(), 2 * SI, false, threads);
  gated_rows(s.gu.data(), rows, SI, s.act.data(), threads);
  if (!m.shared_gate) {
    linear(m.shared_down, s.act.data(), rows, xq, h, H, true, threads);
    return;
  }
  grow_to(s.ys, R * H);
  linear(m.shared_down, s.act.data(), rows, xq, s.ys.data(), H, false, threads);
#pragma omp parallel for num_threads(threads) if (rows >= TILED_MIN_ROWS)
  for (int r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * H;
    const float g = 1.f / (1.f + std::exp(-dot(xn + o, m.shared_gate, H)));
    axpy(g, s.ys.data() + o, h + o, H);
  }
}

// h [rows, H] += the MoE feed-forward of xn [rows, H] (the post-attention-normed rows).
inline void moe_forward(const MoeLayer& m, const float* xn, int rows, int H, float* h,
                        QuantRows& xq, int threads) {
  // a reference: inside the parallel loops the thread_local's name would be each pool
  // thread's own (empty) scratch
  static thread_local MoeScratch kept;
  MoeScratch& s = kept;
  const int E = m.num_experts, k = m.top_k, I = m.inter, slots = rows * k;
  const size_t R = static_cast<size_t>(rows);
  grow_to(s.logits, R * E), grow_to(s.weights, static_cast<size_t>(slots));
  if (s.ids.size() < static_cast<size_t>(slots)) {
    s.ids.resize(slots);
    s.order.resize(slots);
  }
  linear(m.router, xn, rows, xq, s.logits.data(), E, false, threads);
#pragma omp parallel for num_threads(threads) if (rows >= TILED_MIN_ROWS)
  for (int r = 0; r < rows; ++r) {
    route_softmax_topk(&s.logits[r * static_cast<size_t>(E)], E, k, m.norm_topk_prob != 0,
                       &s.ids[r * k], &s.weights[r * k]);
  }
  // slot (row r, choice j) = r * k + j; order[start[e] .. start[e + 1]) are expert e's slots
  s.start.assign(E + 1, 0);
  for (int i = 0; i < slots; ++i) ++s.start[s.ids[i] + 1];
  for (int e = 0; e < E; ++e) s.start[e + 1] += s.start[e];
  s.cursor.assign(s.start.begin(), s.start.end() - 1);
  for (int i = 0; i < slots; ++i) s.order[s.cursor[s.ids[i]]++] = i;
  int most = 0;
  for (int e = 0; e < E; ++e) most = std::max(most, s.start[e + 1] - s.start[e]);
  const size_t M = static_cast<size_t>(most);
  grow_to(s.xs, M * H), grow_to(s.gu, M * 2 * I), grow_to(s.act, M * I), grow_to(s.ys, M * H);
  for (int e = 0; e < E; ++e) {
    const int n = s.start[e + 1] - s.start[e];
    if (n == 0) continue;  // an expert no row chose: its weights are not read
    const int32_t* sl = &s.order[s.start[e]];
    for (int i = 0; i < n; ++i) {
      std::memcpy(&s.xs[static_cast<size_t>(i) * H], xn + static_cast<size_t>(sl[i] / k) * H,
                  H * sizeof(float));
    }
    linear(m.gate_up[e], s.xs.data(), n, xq, s.gu.data(), 2 * I, false, threads);
    gated_rows(s.gu.data(), n, I, s.act.data(), threads);
    linear(m.down[e], s.act.data(), n, xq, s.ys.data(), H, false, threads);
    // the rows of one expert are distinct rows of h
#pragma omp parallel for num_threads(threads) if (n >= TILED_MIN_ROWS)
    for (int i = 0; i < n; ++i) {
      axpy(s.weights[sl[i]], &s.ys[static_cast<size_t>(i) * H],
           h + static_cast<size_t>(sl[i] / k) * H, H);
    }
  }
  if (m.shared_inter > 0) moe_shared(m, xn, rows, H, h, xq, s, threads);
}

}  // namespace tnd
