// The mixture-of-experts feed-forward of one decoder layer in the fused forward
// (decode_step.cpp), computing what engine/models/layers/moe.py computes for every router
// engine/models/layers/moe_routing.py has:
//
//   xn [R, H] --router (a float Lin, [E, H])--> logits [R, E] --MoeLayer::routing-->
//       per row k experts and their weights:
//     ROUTE_SOFTMAX      softmax, the k best (renormalised to sum to one when
//                        norm_topk_prob): Mixtral, Qwen2-MoE, Qwen3-MoE
//     ROUTE_DEEPSEEK_V2  softmax; the k best among the topk_group groups (of n_group) whose
//                        best expert scores highest (one group: plain greedy); weights the
//                        scores x routed_scaling
//     ROUTE_DEEPSEEK_V3  sigmoid; the k best of scores + correction_bias among the topk_group
//                        groups whose two best corrected scores sum highest; weights the
//                        chosen *uncorrected* scores (renormalised when norm_topk_prob) x
//                        routed_scaling
//   Equal scores (softmax: the lower id first; DeepSeek's: the experts and groups torch.topk
//   chooses on the CPU, torch_topk).
//   the R x k (row, expert) slots sorted by expert, row order within (a counting sort):
//       e0 e0 e0 | e2 | e5 e5 ...
//   each active expert e, its n_e rows gathered [n_e, H]:
//       --gate_up[e]--> [n_e, 2I] --silu(g) * u--> [n_e, I] --down[e]--> y [n_e, H]
//       h[row] += weight * y                       (a row meets an expert at most once)
//   shared expert: h += down(silu(g) * u) over all rows (DeepSeek's n_shared_experts as one
//   MLP), scaled by sigmoid(xn . shared_gate) where there is one (Qwen2-MoE)
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
#include <utility>
#include <vector>

#include "gemm_tiled.h"
#include "quant_linear.h"
#include "vec_math.h"

namespace tnd {

// Expert groups a DeepSeek router may have (moe_layer.py refuses more; released models: 8).
constexpr int MAX_MOE_GROUPS = 256;

enum Routing : int32_t { ROUTE_SOFTMAX = 0, ROUTE_DEEPSEEK_V2 = 1, ROUTE_DEEPSEEK_V3 = 2 };

struct MoeLayer {
  int32_t num_experts, top_k, inter;  // routed experts, experts per row, each one's width
  int32_t norm_topk_prob;             // nonzero: the k weights renormalised to sum to one
  int32_t routing;                    // tnd::Routing
  int32_t n_group, topk_group;        // DeepSeek: experts in n_group equal groups, the best
                                      // topk_group of them eligible (1, 1: all)
  float routed_scaling;               // DeepSeek: the weights' factor
  const float* correction_bias;       // [E] fp32, ROUTE_DEEPSEEK_V3's choice-only bias
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

// The k best of v[0 .. n) as torch.topk(sorted=False) chooses them on the CPU (ATen's
// topk_impl_loop): (value, index) pairs in index order, then std::partial_sort of the first k
// when k * 64 <= n, else std::nth_element at k - 1, both by value (NaN first). Neither is
// stable: among equal values, which are chosen is the algorithm's doing, so the same
// algorithm (libstdc++'s, as torch's CPU build) over the same sequence chooses the same ones.
using ScorePairs = std::vector<std::pair<float, int64_t>>;
inline void torch_topk(const float* v, int n, int k, int32_t* ids, ScorePairs& q) {
  q.resize(n);
  for (int i = 0; i < n; ++i) q[i] = {v[i], i};
  auto larger = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (static_cast<int64_t>(k) * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), larger);
  } else {
    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), larger);
  }
  for (int j = 0; j < k; ++j) ids[j] = static_cast<int32_t>(q[j].second);
}

// DeepSeek-V2 (softmax) and V3 (sigmoid) routing of one row (the header's diagram): the
// group-limited choice of k experts and their weights, each top-k as torch's (torch_topk).
// `score`, `choice`, `allowed`: E-long scratch; `q`: torch_topk's.
inline void route_deepseek(const MoeLayer& m, const float* logits, int32_t* ids, float* w,
                           float* score, float* choice, uint8_t* allowed, ScorePairs& q) {
  const int E = m.num_experts, k = m.top_k, G = m.n_group, per = E / G;
  const bool v3 = m.routing == ROUTE_DEEPSEEK_V3;
  if (v3) {
    for (int e = 0; e < E; ++e) {
      score[e] = 1.f / (1.f + std::exp(-logits[e]));
      choice[e] = score[e] + m.correction_bias[e];
    }
  } else {
    float mx = logits[0], sum = 0.f;
    for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
    for (int e = 0; e < E; ++e) sum += (score[e] = std::exp(logits[e] - mx));
    for (int e = 0; e < E; ++e) choice[e] = (score[e] /= sum);
  }
  // a group's rank: its best score (V2) or the sum of its two best corrected scores (V3)
  float group_score[MAX_MOE_GROUPS];
  int32_t best_groups[MAX_MOE_GROUPS];
  for (int g = 0; g < G; ++g) {
    const float* c = choice + g * per;
    float a = -INFINITY, b = -INFINITY;  // the best two
    for (int i = 0; i < per; ++i) {
      if (c[i] > a) {
        b = a, a = c[i];
      } else if (c[i] > b) {
        b = c[i];
      }
    }
    group_score[g] = v3 ? a + (per > 1 ? b : 0.f) : a;
  }
  torch_topk(group_score, G, m.topk_group, best_groups, q);
  std::memset(allowed, 0, E);
  for (int j = 0; j < m.topk_group; ++j) std::memset(allowed + best_groups[j] * per, 1, per);
  // the other groups' experts as the torch path masks them (V2: score 0, V3: -inf): a pick
  // among them (k past the allowed experts) is the torch path's too
  for (int e = 0; e < E; ++e) {
    if (!allowed[e]) choice[e] = v3 ? -INFINITY : 0.f;
  }
  torch_topk(choice, E, k, ids, q);
  float sum = 0.f;
  for (int j = 0; j < k; ++j) sum += (w[j] = v3 ? score[ids[j]] : choice[ids[j]]);
  const float norm = v3 && m.norm_topk_prob ? sum + 1e-20f : 1.f;
  for (int j = 0; j < k; ++j) w[j] = w[j] / norm * m.routed_scaling;
}

// One row's k experts and weights under m's router (logits: the row's E router outputs).
inline void route_row(const MoeLayer& m, const float* logits, int32_t* ids, float* w) {
  const int E = m.num_experts;
  if (m.routing == ROUTE_SOFTMAX) {
    route_softmax_topk(logits, E, m.top_k, m.norm_topk_prob != 0, ids, w);
    return;
  }
  std::vector<float> score(2 * static_cast<size_t>(E));
  std::vector<uint8_t> allowed(E);
  ScorePairs q;
  route_deepseek(m, logits, ids, w, score.data(), score.data() + E, allowed.data(), q);
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
    route_row(m, &s.logits[r * static_cast<size_t>(E)], &s.ids[r * k], &s.weights[r * k]);
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
