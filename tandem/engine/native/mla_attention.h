// Multi-head latent attention (DeepSeek-V2/V3) of one decoder layer in the fused forward
// (decode_step.cpp), computing what engine/models/layers/mla.py computes. Decode rows (and any
// row outside a long enough prefill segment) attend in latent space, the absorbed form:
//
//   xn [R, H] --q_proj, or q_a -> q_a_norm -> q_b (q-LoRA)--> q [R, nh, nope | rope]
//   xn --kv_a--> [c (rank) | k_pe (rope)];  c --kv_a_norm-->;  RoPE on q_pe and k_pe
//   [c | k_pe] --> the latent cache: one plane, one "head" of W = rank + rope per token
//   q_lat = q_nope . W_UK[h]  [R, nh, rank]   (kv_b's key rows of head h: [nope, rank])
//   [q_lat | q_pe] --paged_attention, one KV head of width W, keys = values = cached rows-->
//       o [R, nh, W], of which the first rank values are the weighted latent
//   out[h] = W_UV[h] . o_lat[h]  [R, nh * vd]  (kv_b's value rows of head h: [vd, rank])
//   (the caller adds o_proj(out) to the residual)
//
// A prefill segment (a sequence's rows at consecutive positions) that mla_decompresses picks
// attends over its context decompressed instead (mla_decompress.h), as the torch path's
// prefill rows do: equal in exact arithmetic, fewer products for a long chunk. Every row's
// latent row is written to the cache first, the same bytes either way.
//
// kv_b is read in place ([nh, nope + vd, rank], fp32/bf16/fp16), a head at a time for all
// rows. The cache may be fp32, bf16 or fp16 (the torch path keeps MLA's latent cache in a
// float dtype).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_tiled.h"
#include "kv_head.h"
#include "mla_decompress.h"
#include "norm_rope.h"
#include "paged_attention.h"
#include "quant_linear.h"
#include "vec_math.h"

namespace tnd {

struct MlaLayer {
  int32_t q_lora_rank;  // 0: q_b is q_proj [nh * qk, H]
  int32_t rank, rope, nope, v_dim;  // kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
  int32_t interleave;  // nonzero: RoPE on adjacent pairs (rope_interleaved)
  float scale;         // the softmax scale (yarn's mscale folded in)
  float latent_eps;    // q_a_norm's and kv_a_norm's eps
  Lin q_a, q_b;        // q-LoRA: q_a [q_lora_rank, H], q_b [nh * qk, q_lora_rank]
  const float* q_a_norm;   // [q_lora_rank] fp32 (q-LoRA)
  Lin kv_a;                // [rank + rope, H] (maybe biased)
  const float* kv_a_norm;  // [rank] fp32
  Lin kv_b;                // [nh * (nope + vd), rank], a float kind (fp32, bf16, fp16)
};

struct MlaScratch {
  std::vector<float> qa, q, kv, qabs, olat, qg, og;
  std::vector<int> absorbed;
  std::vector<int64_t> pos;
  std::vector<const int32_t*> tables;
};

// Heads x rows from which the absorption runs on the thread pool: a decode row of a real
// model (128 heads, each a [128, 512] and a [512, 128] product) pays for it, a tiny test
// model's few heads do not.
constexpr int ABSORB_MIN_TASKS = 16;

// kv_b's rows as fp32/bf16/fp16: row i of `w`.
template <class T>
inline const T* kv_b_row(const Lin& w, size_t i) {
  return reinterpret_cast<const T*>(w.q) + i * static_cast<size_t>(w.k);
}

// q_lat [rows, nh, W] (first rank values) from q [rows, nh, qk]; out [rows, nh * vd] from
// olat [rows, nh, W]: through kv_b's per-head key and value rows, a head per task.
template <class T>
inline void absorb_in(const MlaLayer& m, int nh, const float* q, int rows, float* qabs,
                      int threads) {
  const int qk = m.nope + m.rope, W = m.rank + m.rope, R = m.rank;
#pragma omp parallel for num_threads(threads) if (rows * nh >= ABSORB_MIN_TASKS)
  for (int h = 0; h < nh; ++h) {
    for (int r = 0; r < rows; ++r) {
      float* ql = qabs + (static_cast<size_t>(r) * nh + h) * W;
      const float* qr = q + (static_cast<size_t>(r) * nh + h) * qk;
      std::memset(ql, 0, R * sizeof(float));
      for (int n = 0; n < m.nope; ++n) {
        axpy(qr[n], kv_b_row<T>(m.kv_b, static_cast<size_t>(h) * (m.nope + m.v_dim) + n), ql, R);
      }
      std::memcpy(ql + R, qr + m.nope, m.rope * sizeof(float));
    }
  }
}

template <class T>
inline void absorb_out(const MlaLayer& m, int nh, const float* olat, int rows, float* out,
                       int threads) {
  const int W = m.rank + m.rope, vd = m.v_dim;
#pragma omp parallel for num_threads(threads) if (rows * nh >= ABSORB_MIN_TASKS)
  for (int h = 0; h < nh; ++h) {
    for (int v = 0; v < vd; ++v) {
      const T* wv = kv_b_row<T>(m.kv_b, static_cast<size_t>(h) * (m.nope + vd) + m.nope + v);
      for (int r = 0; r < rows; ++r) {
        out[(static_cast<size_t>(r) * nh + h) * vd + v] =
            dot(olat + (static_cast<size_t>(r) * nh + h) * W, wv, m.rank);
      }
    }
  }
}

// out [rows, nh * vd]: rows attending in latent space, queries q [rows, nh, qk] (RoPE
// applied), their latent rows already in the cache.
template <int F>
inline void mla_absorbed(const MlaLayer& m, int nh, const float* q, int rows, const int64_t* pos,
                         const int32_t* const* tables, int block_size, const uint8_t* cache,
                         float* out, int threads) {
  static thread_local MlaScratch kept;
  MlaScratch& s = kept;
  const int W = m.rank + m.rope;
  const size_t rs = static_cast<size_t>(rows);
  if (s.qabs.size() < rs * nh * W) s.qabs.resize(rs * nh * W);
  if (s.olat.size() < rs * nh * W) s.olat.resize(rs * nh * W);
  switch (m.kv_b.kind) {
    case 5: absorb_in<bf16>(m, nh, q, rows, s.qabs.data(), threads); break;
    case 6: absorb_in<f16>(m, nh, q, rows, s.qabs.data(), threads); break;
    default: absorb_in<float>(m, nh, q, rows, s.qabs.data(), threads); break;
  }
  const AttnShape shape{nh, 1, W, block_size, m.scale};
  paged_attention<F>(shape, s.qabs.data(), nh * W, rows, pos, tables, cache, cache,
                     s.olat.data(), threads);
  switch (m.kv_b.kind) {
    case 5: absorb_out<bf16>(m, nh, s.olat.data(), rows, out, threads); break;
    case 6: absorb_out<f16>(m, nh, s.olat.data(), rows, out, threads); break;
    default: absorb_out<float>(m, nh, s.olat.data(), rows, out, threads); break;
  }
}

// out [rows, nh * vd] = the attention of rows xn [rows, H] (row r at pos[r], its latent row
// written to cache slot slot[r], its sequence's blocks tables[r]); cos/sin [P, rope].
template <int F>
inline void mla_attention(const MlaLayer& m, int nh, const float* xn, int rows,
                          const int64_t* pos, const int64_t* slot, const int32_t* const* tables,
                          int block_size, uint8_t* cache, const float* cos, const float* sin,
                          float* out, QuantRows& xq, int threads) {
  static thread_local MlaScratch kept;  // a reference: see moe_experts.h's moe_forward
  MlaScratch& s = kept;
  const int qk = m.nope + m.rope, W = m.rank + m.rope, R = m.rank;
  const size_t rs = static_cast<size_t>(rows);
  auto grow = [](std::vector<float>& v, size_t n) { if (v.size() < n) v.resize(n); };
  grow(s.q, rs * nh * qk), grow(s.kv, rs * W);
  if (m.q_lora_rank) {
    grow(s.qa, rs * m.q_lora_rank);
    linear(m.q_a, xn, rows, xq, s.qa.data(), m.q_lora_rank, false, threads);
    for (int r = 0; r < rows; ++r) {
      float* a = &s.qa[r * static_cast<size_t>(m.q_lora_rank)];
      rms_norm(a, m.q_a_norm, m.latent_eps, m.q_lora_rank, a);
    }
    linear(m.q_b, s.qa.data(), rows, xq, s.q.data(), nh * qk, false, threads);
  } else {
    linear(m.q_b, xn, rows, xq, s.q.data(), nh * qk, false, threads);
  }
  linear(m.kv_a, xn, rows, xq, s.kv.data(), W, false, threads);
  const int head_bytes = KVHead<F>::bytes(W);
#pragma omp parallel for num_threads(threads) if (rows >= TILED_MIN_ROWS)
  for (int r = 0; r < rows; ++r) {
    const float* c = cos + pos[r] * m.rope;
    const float* sn = sin + pos[r] * m.rope;
    auto rotate = [&](float* x) {
      if (m.interleave) {
        rope_interleaved(x, c, sn, m.rope);
      } else {
        tnd::rope(x, c, sn, m.rope);
      }
    };
    float* kv = &s.kv[r * static_cast<size_t>(W)];
    rms_norm(kv, m.kv_a_norm, m.latent_eps, R, kv);
    rotate(kv + R);
    store_head<F>(kv, W, cache + slot[r] * head_bytes);
    for (int h = 0; h < nh; ++h) rotate(&s.q[(r * static_cast<size_t>(nh) + h) * qk + m.nope]);
  }
  // Prefill segments (a sequence's rows at consecutive positions) that decompress
  // (mla_decompress.h); the other rows attend absorbed, all together.
  std::vector<int>& absorbed = s.absorbed;
  absorbed.clear();
  for (int r = 0; r < rows;) {
    int e = r + 1;
    while (e < rows && tables[e] == tables[r] && pos[e] == pos[e - 1] + 1) ++e;
    if (mla_decompresses(m, e - r, pos[r])) {
      mla_decompressed<F>(m, nh, &s.q[r * static_cast<size_t>(nh) * qk], e - r, pos[r],
                          tables[r], block_size, cache, out + r * static_cast<size_t>(nh) * m.v_dim,
                          threads);
    } else {
      for (int i = r; i < e; ++i) absorbed.push_back(i);
    }
    r = e;
  }
  if (static_cast<int>(absorbed.size()) == rows) {
    mla_absorbed<F>(m, nh, s.q.data(), rows, pos, tables, block_size, cache, out, threads);
  } else if (!absorbed.empty()) {  // those rows gathered, attended, their outputs scattered
    const int na = static_cast<int>(absorbed.size()), vd = m.v_dim;
    grow(s.qg, static_cast<size_t>(na) * nh * qk), grow(s.og, static_cast<size_t>(na) * nh * vd);
    s.pos.resize(na), s.tables.resize(na);
    for (int i = 0; i < na; ++i) {
      const int r = absorbed[i];
      std::memcpy(&s.qg[static_cast<size_t>(i) * nh * qk], &s.q[static_cast<size_t>(r) * nh * qk],
                  static_cast<size_t>(nh) * qk * sizeof(float));
      s.pos[i] = pos[r], s.tables[i] = tables[r];
    }
    mla_absorbed<F>(m, nh, s.qg.data(), na, s.pos.data(), s.tables.data(), block_size, cache,
                    s.og.data(), threads);
    for (int i = 0; i < na; ++i) {
      std::memcpy(out + static_cast<size_t>(absorbed[i]) * nh * vd,
                  &s.og[static_cast<size_t>(i) * nh * vd], static_cast<size_t>(nh) * vd * sizeof(float));
    }
  }
}

}  // namespace tnd
