// A whole Llama-family forward over any number of query rows on an AVX2 CPU, in one call.
//
// Built by engine/native/build.py (g++ -O3 -mavx2 -mfma -mf16c -fopenmp, and a second time
// with the AVX-512/VNNI flags where the CPU has them: TND_AVX512 paths; OpenMP resolves to
// the libgomp torch already loaded, so the two share one thread pool) and called through
// ctypes from engine/native/fused_forward.py. It exists because a CPU decode step of a small
// model is dominated by per-op overhead (~450 torch ops a step) and by torch's int4 kernel
// (~7 GB/s of weights on AVX2); here each layer is a handful of loops and the quantized
// matrix-vector products read weights at memory speed.
//
// Numerics follow engine/models/causal_lm.py in fp32 with one difference: activations entering a
// quantized linear are quantized to int16 in blocks of 32 (one fp32 scale per block), so the
// inner products run on integers (_mm256_madd_epi16), as llama.cpp does with int8 ones.
// Unquantized linears (fp32, or a bf16/fp16 model's own 16-bit weights, widened in registers)
// multiply fp32 activations: a bf16 model runs here as its weights upcast to fp32 would, not
// with the torch path's bf16 activations.
//
// LoRA: a step may carry adapters (Step::lora), each row under its own or none; their deltas
// are added to the q/k/v, o, gate/up and down outputs (lora_delta.h).
// Mixture-of-experts layers (Mixtral, Qwen2/Qwen3-MoE, DeepSeek-V2/V3's routers):
// moe_experts.h, in place of a layer's dense MLP where its Layer::moe says so.
// Multi-head latent attention (DeepSeek-V2/V3): mla_attention.h, in place of a layer's q/k/v
// attention where its Layer::mla says so (every layer of such a model: ModelDesc::latent_dim),
// over the latent cache [L, 1, num_blocks, block_size, 1, latent_dim] (fp32, bf16 or fp16).
// Weight formats: quant_linear.h; the few-row loops: linear_rows.h (dot_rows.h,
// dot_rows512.h); many rows (batched decodes, prefill chunks): gemm_tiled.h, whose linear()
// picks between the two. Attention: paged_attention.h (KV head vectors: kv_head.h; prefill
// tiles: attention_tiles.h). The embedding table may be a Lin of any kind (a GGUF's Q8_0
// token_embd shared with the tied lm_head, a bf16 model's own table): rows are widened on
// use. KV cache: the engine's layout, fp32, bf16, fp16 or fp8 (e4m3 bytes over Step::k_scale
// and v_scale, one K and one V scale per layer: engine/quant/kv_fp8.py) [L, 2, num_blocks,
// block_size, Hkv, hd],
// or int8 [L, 2, num_blocks, block_size, Hkv, hd + 4] (each head vector's fp32 scale in its
// last 4 bytes; engine/quant/kv_int8.py), written and read with the same rounding as the torch
// path (an fp8 cache's bytes are the ones torch's quantize_fp8 writes for the same K/V).
// Rows: row r is token ids[r] at position pos[r] of sequence seq[r]; it attends to positions
// 0..pos[r] of its sequence (pos[r] - window + 1 .. pos[r] in a sliding-window layer, whose
// blocks before that may be freed: table entries there are not checked or read) (keys of all rows of this call are written before attending, so
// several rows of one sequence, e.g. speculative drafts, are causal among themselves).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// paged_attention.h first: the order of the definitions steers GCC's inlining. With the
// linears' headers first, -O3 inlines the 512-bit micro-kernels into the tiled GEMM (an avx512
// library 7% larger, no longer the code the kernels were measured with); in this order both
// variants build that code, byte for byte.
#include "paged_attention.h"
#include "gemm_tiled.h"
#include "kv_head.h"
#include "quant_linear.h"
#include "vec_math.h"
#include "lora_delta.h"
#include "moe_experts.h"
#include "mla_attention.h"

namespace {

using tnd::Lin;
using tnd::QuantRows;

struct Layer {
  const float* input_norm;
  const float* post_norm;
  const float* q_norm;  // may be null (Qwen3 has them)
  const float* k_norm;
  Lin qkv, o, gate_up, down;
  int32_t window;  // sliding-window layer: keys it sees, itself included; 0: every key
  const tnd::MoeLayer* moe;  // mixture of experts in place of gate_up/down; null: dense MLP
  const tnd::MlaLayer* mla;  // latent attention in place of qkv (o is its o_proj); null: GQA
};

struct ModelDesc {
  int32_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, vocab;
  int32_t max_positions;
  float eps;
  const float* embed;  // [vocab, hidden] fp32, or null: embed_lin
  const float* cos;    // [max_positions, head_dim] (MLA: head_dim is qk_rope_head_dim)
  const float* sin;
  const float* final_norm;
  Lin lm_head;
  const Layer* layers;  // [num_layers]
  Lin embed_lin;        // the embedding table when embed is null (any Lin kind)
  int32_t latent_dim;   // MLA: the latent cache's row width, one plane of one head; 0: K and V
};

struct Model {
  ModelDesc desc;
  std::vector<Layer> layers;
};

using tnd::rms_norm;  // norm_rope.h
using tnd::rope;

struct Step {
  const int64_t* ids;
  const int64_t* pos;
  const int32_t* seq;           // [rows] sequence index of each row
  const int32_t* block_tables;  // [num_seqs, table_width]
  int32_t table_width;
  int32_t block_size;
  int32_t num_blocks;
  void* kv;           // [L, 2, num_blocks, block_size, Hkv, hd (+ 4 for int8)]
  int32_t kv_format;  // tnd::KVFormat: 0 fp32, 1 int8 with per-head-vector scales, 2 bf16,
                      // 3 fp16, 4 fp8 (e4m3 over each layer's k_scale and v_scale)
  // Called (on the calling thread) once layer l's K/V are in the cache; nonzero stops the
  // forward (it returns -2). May be null.
  int32_t (*layer_done)(int32_t layer);
  // The step's LoRA adapters and each row's (lora_delta.h); null: no row has one.
  const tnd::LoraStep* lora;
  // An fp8 cache's scales, one K and one V per layer ([num_layers] each; x = e4m3 * scale:
  // finite, > 0); unread (may be null) otherwise.
  const float* k_scale;
  const float* v_scale;
};

}  // namespace

extern "C" {

int tnd_abi_version() { return 11; }

// Width of the hot loops this build compiled: 512 (the AVX-512/VNNI paths) or 256 (AVX2).
int tnd_isa_width() { return TND_AVX512 ? 512 : 256; }

void* tnd_model_create(const ModelDesc* desc) {
  auto* m = new Model{*desc, std::vector<Layer>(desc->layers, desc->layers + desc->num_layers)};
  m->desc.layers = m->layers.data();
  return m;
}

void tnd_model_free(void* model) { delete static_cast<Model*>(model); }

// One linear layer alone (the torch path's quantized modules, tests, the perplexity bench):
// y [rows, w.n] = x [rows, w.k] . w^T (+ bias).
void tnd_linear(const Lin* w, const float* x, int rows, float* y, int threads) {
  QuantRows xq;
  tnd::linear(*w, x, rows, xq, y, w->n, false, threads);
}

// One MoE layer's router alone (tests): logits [rows, E] -> each row's k expert ids and their
// weights, ids and w [rows, k] (moe_experts.h's route_row, as the forward routes).
void tnd_moe_route(const tnd::MoeLayer* m, const float* logits, int rows, int32_t* ids,
                   float* w) {
  const size_t E = static_cast<size_t>(m->num_experts), k = static_cast<size_t>(m->top_k);
  for (int r = 0; r < rows; ++r) tnd::route_row(*m, logits + r * E, ids + r * k, w + r * k);
}

// Whether an MLA layer attends a prefill segment of `rows` rows from position `first` over its
// context decompressed (mla_decompress.h's choice; tests), 1, or in latent space, 0.
int tnd_mla_decompresses(const tnd::MlaLayer* m, int rows, int64_t first) {
  return tnd::mla_decompresses(*m, rows, first) ? 1 : 0;
}

// Rows ids[0 .. n) of an embedding table stored as a Lin: out [n, w.k]. Returns -1 when an id
// is outside the table (nothing written).
int tnd_embed(const Lin* w, const int64_t* ids, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= w->n) return -1;
  }
  for (int i = 0; i < n; ++i) tnd::lin_row(*w, ids[i], out + static_cast<size_t>(i) * w->k);
  return 0;
}

}  // extern "C"

namespace {

template <int F>
int forward(const ModelDesc& md, const Step* st, int rows, const int32_t* sample_rows,
            int num_samples, float* logits, int threads) {
  const int H = md.hidden, nh = md.num_heads, nkv = md.num_kv_heads, hd = md.head_dim;
  const int qsz = nh * hd, kvsz = nkv * hd, qkvsz = qsz + 2 * kvsz, I = md.intermediate;
  const int bs = st->block_size;
  for (int i = 0; i < num_samples; ++i) {
    if (sample_rows[i] < 0 || sample_rows[i] >= rows) return -1;
  }
  // an fp8 cache's scales, times the 2^8 its reads carry, stay finite; no fp8 latent cache
  auto usable = [](float s) { return std::isfinite(s * 256.f) && s > 0.f; };
  if (F == tnd::KV_FP8) {
    if (!st->k_scale || !st->v_scale) return -1;
    for (int l = 0; l < md.num_layers; ++l) {
      if (!(usable(st->k_scale[l]) && usable(st->v_scale[l]))) return -1;
    }
  }
  if ((F == tnd::KV_FP8 || F == tnd::KV_I8) && md.latent_dim) return -1;
  // The widest window when every layer slides (0: some layer sees every key): blocks before
  // it may be freed (table entry -1), so only the blocks from there on must be present.
  int64_t reach = 0;
  for (int l = 0; l < md.num_layers; ++l) {
    if (md.layers[l].window <= 0) {
      reach = 0;
      break;
    }
    reach = std::max<int64_t>(reach, md.layers[l].window);
  }
  std::vector<int64_t> slot(rows);
  for (int r = 0; r < rows; ++r) {
    const int64_t p = st->pos[r];
    if (p < 0 || p >= md.max_positions || st->ids[r] < 0 || st->ids[r] >= md.vocab) return -1;
    const int32_t* table = st->block_tables + static_cast<size_t>(st->seq[r]) * st->table_width;
    for (int64_t j = reach > 0 ? std::max<int64_t>(0, p - reach + 1) / bs : 0; j <= p / bs; ++j) {
      if (j >= st->table_width || table[j] < 0 || table[j] >= st->num_blocks) return -1;
    }
    slot[r] = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
  }
  // Activations, kept by the calling thread (the engine's) from step to step and grown as
  // needed; every element is written before it is read. Allocated per step, a 512-row
  // chunk's 15 MB had their pages faulted in and zeroed every time (~2% of the chunk).
  // (References: inside the parallel loops a thread_local name would be each pool thread's.)
  static thread_local std::vector<float> kept[6];
  std::vector<float>&h = kept[0], &xn = kept[1], &qkv = kept[2], &att = kept[3], &gu = kept[4],
                     &act = kept[5];
  const size_t R = static_cast<size_t>(rows);
  auto grow = [](std::vector<float>& v, size_t n) { if (v.size() < n) v.resize(n); };
  grow(h, R * H), grow(xn, R * H), grow(qkv, R * qkvsz), grow(att, R * qsz);
  grow(gu, R * 2 * I), grow(act, R * I);
  QuantRows xq;
  static thread_local tnd::LoraPlan lora_plan;
  if (st->lora && !tnd::plan_lora(*st->lora, rows, md.num_layers, lora_plan)) return -1;
  // output column ranges of the fused projections' sub-projections, for the LoRA deltas
  const int qkv_cols[4] = {0, qsz, qsz + kvsz, qkvsz}, gu_cols[3] = {0, I, 2 * I};
  const int o_cols[2] = {0, H};
  auto lora = [&](int l, int proj, const float* x, int in, float* y, int ldy, const int* cols,
                  int nsub) {
    if (st->lora) tnd::lora_delta(*st->lora, lora_plan, l, proj, x, in, in, y, ldy, cols, nsub, threads);
  };
  const bool par = rows >= tnd::TILED_MIN_ROWS;  // elementwise loops: threads pay from here
#pragma omp parallel for num_threads(threads) if (par)
  for (int r = 0; r < rows; ++r) {
    float* dst = &h[static_cast<size_t>(r) * H];
    if (md.embed) {
      std::memcpy(dst, md.embed + st->ids[r] * H, H * sizeof(float));
    } else {
      tnd::lin_row(md.embed_lin, st->ids[r], dst);
    }
  }
  const int lat = md.latent_dim;  // MLA: one plane of one latent head per layer
  const int head_bytes = tnd::KVHead<F>::bytes(lat ? lat : hd);
  const size_t slot_bytes = static_cast<size_t>(lat ? 1 : nkv) * head_bytes;
  const size_t kv_half = static_cast<size_t>(st->num_blocks) * bs * slot_bytes;  // bytes
  const size_t layer_stride = (lat ? 1 : 2) * kv_half;
  if (lat) grow(att, R * md.num_heads * md.layers[0].mla->v_dim);
  std::vector<const int32_t*> tables(rows);
  for (int r = 0; r < rows; ++r) {
    tables[r] = st->block_tables + static_cast<size_t>(st->seq[r]) * st->table_width;
  }
  for (int l = 0; l < md.num_layers; ++l) {
    const Layer& ly = md.layers[l];
    uint8_t* kc = static_cast<uint8_t*>(st->kv) + l * layer_stride;
    uint8_t* vc = kc + kv_half;
    // an fp8 cache's scales for this layer (the other formats store and read values as they are)
    const float k_scale = F == tnd::KV_FP8 ? st->k_scale[l] : 1.f;
    const float v_scale = F == tnd::KV_FP8 ? st->v_scale[l] : 1.f;
    const tnd::AttnShape attn{nh, nkv, hd, bs, 1.f / std::sqrt(static_cast<float>(hd)), k_scale,
                              v_scale};
#pragma omp parallel for num_threads(threads) if (par)
    for (int r = 0; r < rows; ++r) rms_norm(&h[r * H], ly.input_norm, md.eps, H, &xn[r * H]);
    if (ly.mla) {  // no LoRA (the adapter manager refuses a latent-attention model)
      tnd::mla_attention<F>(*ly.mla, nh, xn.data(), rows, st->pos, slot.data(), tables.data(),
                            bs, kc, md.cos, md.sin, att.data(), xq, threads);
      tnd::linear(ly.o, att.data(), rows, xq, h.data(), H, true, threads);
    } else {
      tnd::linear(ly.qkv, xn.data(), rows, xq, qkv.data(), qkvsz, false, threads);
      lora(l, 0, xn.data(), H, qkv.data(), qkvsz, qkv_cols, 3);
#pragma omp parallel for num_threads(threads) if (par)
      for (int r = 0; r < rows; ++r) {
        float* q = &qkv[static_cast<size_t>(r) * qkvsz];
        float* k = q + qsz;
        const float* v = k + kvsz;
        if (ly.q_norm) {
          for (int i = 0; i < nh; ++i) rms_norm(q + i * hd, ly.q_norm, md.eps, hd, q + i * hd);
          for (int i = 0; i < nkv; ++i) rms_norm(k + i * hd, ly.k_norm, md.eps, hd, k + i * hd);
        }
        const float* c = md.cos + st->pos[r] * hd;
        const float* s = md.sin + st->pos[r] * hd;
        for (int i = 0; i < nh; ++i) rope(q + i * hd, c, s, hd);
        for (int i = 0; i < nkv; ++i) rope(k + i * hd, c, s, hd);
        for (int i = 0; i < nkv; ++i) {
          tnd::store_head<F>(k + i * hd, hd, kc + slot[r] * slot_bytes + i * head_bytes,
                             k_scale);
          tnd::store_head<F>(v + i * hd, hd, vc + slot[r] * slot_bytes + i * head_bytes,
                             v_scale);
        }
      }
      tnd::paged_attention<F>(attn, qkv.data(), qkvsz, rows, st->pos, tables.data(), kc, vc,
                           att.data(), threads, ly.window);
      tnd::linear(ly.o, att.data(), rows, xq, h.data(), H, true, threads);
      lora(l, 1, att.data(), qsz, h.data(), H, o_cols, 1);
    }
#pragma omp parallel for num_threads(threads) if (par)
    for (int r = 0; r < rows; ++r) rms_norm(&h[r * H], ly.post_norm, md.eps, H, &xn[r * H]);
    if (ly.moe) {  // experts: no LoRA (the adapter manager refuses a MoE model)
      tnd::moe_forward(*ly.moe, xn.data(), rows, H, h.data(), xq, threads);
    } else {
      tnd::linear(ly.gate_up, xn.data(), rows, xq, gu.data(), 2 * I, false, threads);
      lora(l, 2, xn.data(), H, gu.data(), 2 * I, gu_cols, 2);
#pragma omp parallel for num_threads(threads) if (par)
      for (int r = 0; r < rows; ++r) {
        const float* g = &gu[static_cast<size_t>(r) * 2 * I];
        tnd::silu_mul(g, g + I, &act[static_cast<size_t>(r) * I], I);
      }
      tnd::linear(ly.down, act.data(), rows, xq, h.data(), H, true, threads);
      lora(l, 3, act.data(), I, h.data(), H, o_cols, 1);
    }
    if (st->layer_done && st->layer_done(l) != 0) return -2;
  }
  std::vector<float> fin(static_cast<size_t>(num_samples) * H);
  for (int i = 0; i < num_samples; ++i) {
    rms_norm(&h[static_cast<size_t>(sample_rows[i]) * H], md.final_norm, md.eps, H, &fin[i * H]);
  }
  tnd::linear(md.lm_head, fin.data(), num_samples, xq, logits, md.vocab, false, threads);
  return 0;
}

}  // namespace

extern "C" {

// Runs the model over `rows` query rows; writes their K/V into the cache and the logits of
// rows sample_rows[0 .. num_samples) into logits [num_samples, vocab]. Returns 0, or -1 (with
// nothing written) when a position is outside the RoPE table, a block a position needs is
// missing from its table or outside the cache, a token id is outside the vocabulary, or a
// sample row is not one of the rows, a row's LoRA slot or an adapter's rank is out of range,
// the KV format is unknown, or an fp8 cache's scale is not finite and positive; -2 when the layer callback asked to stop. The caller checks that seq[r] indexes a table.
int tnd_forward(void* model, const Step* st, int rows, const int32_t* sample_rows,
                int num_samples, float* logits, int threads) {
  const ModelDesc& md = static_cast<Model*>(model)->desc;
  switch (st->kv_format) {
    case tnd::KV_F32: return forward<tnd::KV_F32>(md, st, rows, sample_rows, num_samples, logits, threads);
    case tnd::KV_I8: return forward<tnd::KV_I8>(md, st, rows, sample_rows, num_samples, logits, threads);
    case tnd::KV_BF16: return forward<tnd::KV_BF16>(md, st, rows, sample_rows, num_samples, logits, threads);
    case tnd::KV_F16: return forward<tnd::KV_F16>(md, st, rows, sample_rows, num_samples, logits, threads);
    case tnd::KV_FP8: return forward<tnd::KV_FP8>(md, st, rows, sample_rows, num_samples, logits, threads);
    default: return -1;
  }
}

}  // extern "C"
