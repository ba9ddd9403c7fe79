// Multi-head latent attention of a prefill segment (a sequence's rows at consecutive positions
// p0 .. p0 + n - 1 of one step) over its context decompressed, as the torch path's
// attend_decompressed (engine/attention/mla.py) and vLLM's MLA prefill compute it:
//
//   the context's cached rows [c | k_pe], positions 0 .. p0 + n - 1 (the segment's own rows
//   written first: mla_attention.h), widened to fp32
//   per head h (a task): K_h = [c . W_UK[h]^T | k_pe] [S, nope + rope] and V_h = c . W_UV[h]^T
//   [S, vd] through kv_b's rows of that head (the tiled GEMM, gemm_tiled.h, on kv_b's weights
//   in place); scores = q_h . K_h^T (the tiled GEMM again, K_h as its weight), causal (row i
//   sees keys 0 .. p0 + i), softmax; out_h = P . V_h (V_h transposed as the weight)
//
// Per head and token this multiplies R x (nope + vd) once for the context and (nope + rope +
// vd) per key a row sees; the absorbed form (every row in latent space) multiplies R x (nope
// + vd) per query row and (2 R + rope) per key a row sees: for a fresh prompt of 512-2,048
// tokens of DeepSeek-V2's shape the decompressed one is 2-3x fewer products, for a short chunk
// after a long context (a prefix-cache hit, a late chunk of a chunked prefill) the absorbed
// one can be far fewer. mla_decompresses chooses by those counts. The latent cache is only
// read here: its layout and bytes are the absorbed path's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_tiled.h"
#include "kv_head.h"
#include "vec_math.h"

namespace tnd {

// M below is tnd::MlaLayer (mla_attention.h, which includes this header).

// Rows from which a segment may decompress: the tiled GEMM's (gemm_tiled.h); decodes and most
// speculative verifications stay absorbed.
constexpr int MLA_DECOMPRESS_MIN_ROWS = 8;
// What one product of the absorbed form costs in products of the decompressed form's tiled
// GEMMs: its per-row absorptions are matrix-vector loops (kv_b re-read per row) and its
// attention runs 576-wide heads through the paged loops. One DeepSeek-V2-Lite layer, 1
// thread, fp32 (a shared, noisy machine), decompressed / absorbed step time: fresh chunks of
// 4-512 rows 0.53-0.77x; 128 rows after 512 or 2,048 cached 0.63x, 0.72x; 64 after 512
// 1.05x; 16 after 512 and 32 after 2,048 1.85x, 1.81x; 8 after 64 or 256 ~1.5x. A factor of 2
// puts each of those on its faster side.
constexpr double MLA_LATENT_PRODUCT_COST = 2.0;
// Context (cached + the segment's rows) up to which a segment may decompress: each pool thread
// keeps its head's decompressed keys and values ([S, 192] + 2 x [128, S] floats at
// DeepSeek-V2-Lite's shape) and the scores of a pass ([128, S]) between calls, ~18 MB a thread
// at 8,192 and growing with S; a longer context attends absorbed (latent, no per-S scratch).
constexpr int64_t MLA_DECOMPRESS_MAX_CONTEXT = 8192;
// Query rows per pass over a head's keys: a pass's scores ([rows, keys] floats) stay small,
// and its keys stop at its last row's position (causal: the later keys are never multiplied).
constexpr int MLA_QUERY_PASS = 128;

// A float matrix [n, k] (rows k floats apart) as the tiled GEMM's weight.
inline Lin fp32_lin(const float* w, int n, int k) {
  return Lin{3, n, k, reinterpret_cast<const uint8_t*>(w), nullptr, nullptr, nullptr};
}

// Rows [n0, n0 + n) of a float-kind weight (fp32, bf16, fp16: rows k values apart) as a Lin.
inline Lin lin_rows(const Lin& w, int n0, int n) {
  const size_t elem = w.kind == 3 ? sizeof(float) : sizeof(uint16_t);
  return Lin{w.kind, n, w.k, w.q + static_cast<size_t>(n0) * w.k * elem, nullptr, nullptr,
             w.bias ? w.bias + n0 : nullptr};
}

inline int round_up(int x, int to) { return (x + to - 1) / to * to; }

struct MlaPrefillScratch {
  std::vector<float> c, kpe;  // the context's latent rows: [S, R], [S, rope]
};

struct MlaHeadScratch {
  // a head's keys [S, qkp], values transposed [vd, S] and a pass's [vd, sp], its W_UV rows
  // [vd, R] as floats, queries [n, qkp] (times the softmax scale), a pass's scores [rows, sp]
  // and each row's 1 / softmax sum
  std::vector<float> k, vt_all, vt, wuv, q, sc, inv;
};

// Row i's softmax over its first `keys` scores (in place; the rest of the row's `width` set
// to 0), the sum's reciprocal returned: the weights are left unnormalised.
inline float softmax_row(float* row, int keys, int width) {
  const float mx = max_of(row, keys);
  const __m256 m8 = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= keys; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m8));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; j < keys; ++j) sum += (row[j] = std::exp(row[j] - mx));
  std::fill(row + keys, row + width, 0.f);
  return 1.f / sum;
}

// out[i * out_stride + 0 .. vd) for the segment's rows i of head h: q [n, nh, qk] (rotated),
// the context c [S, R] and k_pe [S, rope] (S = p0 + n), `threads` for its GEMMs and loops.
template <class M>
inline void mla_decompressed_head(const M& m, int nh, int h, const float* q, int n, int64_t p0,
                                  const float* c, const float* kpe, float* out, int out_stride,
                                  int threads) {
  static thread_local MlaHeadScratch kept;  // each pool thread's own
  MlaHeadScratch& s = kept;
  const int qk = m.nope + m.rope, qkp = round_up(qk, QK), vd = m.v_dim, R = m.rank;
  const int S = static_cast<int>(p0) + n;
  const int pass = std::min(n, MLA_QUERY_PASS), sp_max = round_up(S, QK);
  auto grow = [](std::vector<float>& v, size_t size) { if (v.size() < size) v.resize(size); };
  grow(s.k, static_cast<size_t>(S) * qkp), grow(s.vt_all, static_cast<size_t>(vd) * S);
  grow(s.vt, static_cast<size_t>(vd) * sp_max), grow(s.wuv, static_cast<size_t>(vd) * R);
  grow(s.q, static_cast<size_t>(n) * qkp), grow(s.sc, static_cast<size_t>(pass) * sp_max);
  grow(s.inv, pass);
  const int hb = h * (m.nope + vd);
  // K_h = [c . W_UK[h]^T | k_pe | 0 (to a multiple of 32)]
  linear_tiled(lin_rows(m.kv_b, hb, m.nope), c, S, s.k.data(), qkp, false, threads);
#pragma omp parallel for num_threads(threads) if (threads > 1)
  for (int j = 0; j < S; ++j) {
    float* kj = &s.k[static_cast<size_t>(j) * qkp];
    std::memcpy(kj + m.nope, kpe + static_cast<size_t>(j) * m.rope, m.rope * sizeof(float));
    std::fill(kj + qk, kj + qkp, 0.f);
  }
  // V_h^T = W_UV[h] . c^T [vd, S]: the context as the GEMM's weight, so that each pass's
  // weight (its keys' values, transposed) is a copy of row prefixes
  for (int d = 0; d < vd; ++d) lin_row(m.kv_b, hb + m.nope + d, &s.wuv[static_cast<size_t>(d) * R]);
  linear_tiled(fp32_lin(c, S, R), s.wuv.data(), vd, s.vt_all.data(), S, false, threads);
  for (int i = 0; i < n; ++i) {
    float* qi = &s.q[static_cast<size_t>(i) * qkp];
    const float* src = q + (static_cast<size_t>(i) * nh + h) * qk;
    for (int d = 0; d < qk; ++d) qi[d] = src[d] * m.scale;
    std::fill(qi + qk, qi + qkp, 0.f);
  }
  for (int i0 = 0; i0 < n; i0 += pass) {
    const int rows = std::min(pass, n - i0);
    const int seen = static_cast<int>(p0) + i0 + rows, sp = round_up(seen, QK);
    // scores [rows, sp] over the keys the pass's last row sees; row i sees p0 + i0 + i + 1
    linear_tiled(fp32_lin(s.k.data(), seen, qkp), &s.q[static_cast<size_t>(i0) * qkp], rows,
                 s.sc.data(), sp, false, threads);
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int i = 0; i < rows; ++i) {
      s.inv[i] = softmax_row(&s.sc[static_cast<size_t>(i) * sp], static_cast<int>(p0) + i0 + i + 1,
                             sp);
    }
    for (int d = 0; d < vd; ++d) {  // V^T over the same keys, zeros past them
      float* vt = &s.vt[static_cast<size_t>(d) * sp];
      std::memcpy(vt, &s.vt_all[static_cast<size_t>(d) * S], seen * sizeof(float));
      std::fill(vt + seen, vt + sp, 0.f);
    }
    float* o = out + static_cast<size_t>(i0) * out_stride;
    linear_tiled(fp32_lin(s.vt.data(), vd, sp), s.sc.data(), rows, o, out_stride, false, threads);
    for (int i = 0; i < rows; ++i) {
      float* oi = o + static_cast<size_t>(i) * out_stride;
      for (int d = 0; d < vd; ++d) oi[d] *= s.inv[i];
    }
  }
}

// out [n, nh * vd] = the decompressed attention of a segment of n rows at positions p0 ..
// p0 + n - 1 (queries q [n, nh, qk], RoPE applied) over its sequence's cached latent rows
// (block table `table`; positions up to p0 + n - 1 present, the segment's own included).
// Heads are the tasks when there are at least as many as threads; else one head at a time,
// each GEMM on every thread.
template <int F, class M>
inline void mla_decompressed(const M& m, int nh, const float* q, int n, int64_t p0,
                             const int32_t* table, int block_size, const uint8_t* cache,
                             float* out, int threads) {
  static thread_local MlaPrefillScratch kept;
  MlaPrefillScratch& s = kept;
  using KV = KVHead<F>;
  const int R = m.rank, rope = m.rope, W = R + rope, vd = m.v_dim;
  const int S = static_cast<int>(p0) + n, head_bytes = KV::bytes(W);
  if (s.c.size() < static_cast<size_t>(S) * R) s.c.resize(static_cast<size_t>(S) * R);
  if (s.kpe.size() < static_cast<size_t>(S) * rope) s.kpe.resize(static_cast<size_t>(S) * rope);
#pragma omp parallel for num_threads(threads) if (threads > 1)
  for (int j = 0; j < S; ++j) {
    const size_t slot = static_cast<size_t>(table[j / block_size]) * block_size + j % block_size;
    const auto* row = KV::vals(cache + slot * head_bytes);
    float* cj = &s.c[static_cast<size_t>(j) * R];
    float* kj = &s.kpe[static_cast<size_t>(j) * rope];
    for (int i = 0; i < R; ++i) cj[i] = static_cast<float>(row[i]);
    for (int i = 0; i < rope; ++i) kj[i] = static_cast<float>(row[R + i]);
  }
  const int stride = nh * vd;
  if (nh >= threads) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int h = 0; h < nh; ++h) {
      mla_decompressed_head(m, nh, h, q, n, p0, s.c.data(), s.kpe.data(), out + h * vd, stride, 1);
    }
  } else {
    for (int h = 0; h < nh; ++h) {
      mla_decompressed_head(m, nh, h, q, n, p0, s.c.data(), s.kpe.data(), out + h * vd, stride,
                            threads);
    }
  }
}

// Whether a segment of n rows at positions p0 .. p0 + n - 1 attends decompressed: enough
// rows, a kv_b the tiled GEMM reads by rows (fp32, bf16, fp16; R a multiple of 32), and a
// lower cost than the absorbed form (the product counts of this header's comment, per head,
// the absorbed form's weighed by MLA_LATENT_PRODUCT_COST).
template <class M>
inline bool mla_decompresses(const M& m, int n, int64_t p0) {
  const int kind = m.kv_b.kind;
  if (n < MLA_DECOMPRESS_MIN_ROWS || p0 + n > MLA_DECOMPRESS_MAX_CONTEXT || m.rank % QK
      || !(kind == 3 || kind == 5 || kind == 6)) {
    return false;
  }
  const double S = static_cast<double>(p0) + n, seen = static_cast<double>(p0) + (n + 1) / 2.0;
  const double up = static_cast<double>(m.rank) * (m.nope + m.v_dim);
  const double decompressed = S * up + n * seen * (round_up(m.nope + m.rope, QK) + m.v_dim);
  const double absorbed = n * up + n * seen * (2.0 * m.rank + m.rope);
  return decompressed < MLA_LATENT_PRODUCT_COST * absorbed;
}

}  // namespace tnd
