"""The whole-model forward of ``decode_step.cpp`` for the Llama-like families on the CPU.

    FusedForward(model)         reads each PackedLinear (the CPU layout of quantized layers,
                                tandem/engine/native/packed_linear.py) and each fp32, bf16 or fp16
                                linear and embedding table in place; an Int4Linear/Int8Linear
                                of an fp32 model is packed once (a copy); norms are held in
                                fp32 (a copy for a bf16/fp16 model: small); hands the C side a
                                table of pointers (tensors kept alive here)
    fused(rows..., kv_cache)    one ctypes call per step (the GIL is released inside): embeds
                                (a quantized or 16-bit table's rows widened on use), the
                                layers, the final norm, lm_head for the sampling rows; a layer
                                hook is called back between layers; a step's LoRA adapters
                                (tandem/engine/native/lora_step.py) add each row's delta to
                                the q/k/v, o, gate/up and down outputs (lora_delta.h)

It computes the decoder of tandem/engine/models/causal_lm.py (Llama, Mistral, Qwen2, Qwen3,
and the mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE) and of mla_lm.py (DeepSeek-V2/V3):
biases on any linear (q/k/v, o, gate/up, down: each Lin carries its own), per-head q/k norms,
SiLU-gated MLPs, routed experts where a layer is sparse (tandem/engine/native/moe_layer.py,
moe_experts.h: every router of layers/moe_routing.py, each active expert's weights read once a
step for all its rows), and multi-head latent attention over the latent cache
(tandem/engine/native/mla_layer.py, mla_attention.h). ``unsupported_reason`` names what it
does not compute (another model class, another activation), and the model runner keeps torch
for that model.

It serves every CPU step of an fp32, bf16 or fp16 model, decodes and prefill chunks alike:
few-row steps run the matrix-vector loops (integer ones for quantized weights), many-row steps
the tiled fp32 GEMM. Activations are fp32 throughout: a bf16/fp16 model's weights are widened
in registers, so it computes what the same weights upcast to fp32 compute (closer to fp32 than
the torch path's bf16 activations), reading half the bytes. The model runner keeps torch for
what this path does not cover (no compiler, a quantized layer of a bf16/fp16 model not in the
kernels' layout). The KV cache may be fp32, bf16 or fp16 (a 16-bit model's own cache dtype,
rounded to nearest even as torch rounds), int8 with per-head-vector scales
(tandem/engine/quant/kv_int8.py) or fp8: e4m3 bytes over each layer's K and V scales the
forward is made with (tandem/engine/quant/kv_fp8.py), read by widening each byte in registers;
each written with the torch path's rounding (an fp8 cache gets the bytes quantize_fp8 writes
for the same K/V). An fp8 e5m2 cache is declined by name. An MLA model's latent cache is fp32,
bf16 or fp16. Each layer carries its sliding window (0: full attention), as the torch model's
attention modules do.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn

from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers import MLP, Attention, SparseMoE
from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.models.mla_lm import MlaCausalLM
from tandem.engine.native.build import load
from tandem.engine.native.lora_step import NativeLoraStep
from tandem.engine.native.mla_layer import (
    MlaLayerStruct,
    NativeMla,
    attention_linears,
    mla_unsupported,
)
from tandem.engine.native.moe_layer import (
    MoeLayerStruct,
    NativeMoe,
    feed_forward_linears,
    moe_unsupported,
)
from tandem.engine.native.packed_linear import (
    FLOAT_KINDS,
    LinStruct,
    PackedEmbedding,
    PackedLinear,
    takes_any_k,
)
from tandem.engine.quant.int4 import Int4Linear
from tandem.engine.quant.int8 import Int8Linear
from tandem.engine.quant.kv_fp8 import FP8_DTYPE, Fp8Scales
from tandem.engine.quant.kv_int8 import storage_head_dim

log = logging.getLogger(__name__)

QK = 32
_F = ctypes.POINTER(ctypes.c_float)
_U8 = ctypes.POINTER(ctypes.c_uint8)
_LinTypes = (PackedLinear, Int4Linear, Int8Linear, nn.Linear)
# KV cache dtype -> decode_step.cpp's Step::kv_format (tnd::KVFormat)
KV_FORMATS = {torch.float32: 0, torch.int8: 1, torch.bfloat16: 2, torch.float16: 3,
              FP8_DTYPE: 4}


_Lin = LinStruct


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _F), ("post_norm", _F), ("q_norm", _F), ("k_norm", _F),
                ("qkv", _Lin), ("o", _Lin), ("gate_up", _Lin), ("down", _Lin),
                ("window", ctypes.c_int32), ("moe", ctypes.POINTER(MoeLayerStruct)),
                ("mla", ctypes.POINTER(MlaLayerStruct))]


class _ModelDesc(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate",
        "vocab", "max_positions")] + [
        ("eps", ctypes.c_float), ("embed", _F), ("cos", _F), ("sin", _F),
        ("final_norm", _F), ("lm_head", _Lin), ("layers", ctypes.POINTER(_Layer)),
        ("embed_lin", _Lin), ("latent_dim", ctypes.c_int32)]


_LAYER_DONE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)


class _Step(ctypes.Structure):
    _fields_ = [("ids", ctypes.c_void_p), ("pos", ctypes.c_void_p), ("seq", ctypes.c_void_p),
                ("block_tables", ctypes.c_void_p), ("table_width", ctypes.c_int32),
                ("block_size", ctypes.c_int32), ("num_blocks", ctypes.c_int32),
                ("kv", ctypes.c_void_p), ("kv_format", ctypes.c_int32),
                ("layer_done", _LAYER_DONE), ("lora", ctypes.c_void_p),
                ("k_scale", ctypes.c_void_p), ("v_scale", ctypes.c_void_p)]


class NativeLinear:
    """A linear layer as the kernels see it: a :class:`PackedLinear` read in place, an
    Int4Linear/Int8Linear packed into one (a copy: tests and benches), or an fp32, bf16 or fp16
    ``nn.Linear`` (or ``nn.Embedding`` table, ``[V, H]`` as a linear of V outputs) read in place
    (holds what it points at)."""

    def __init__(self, layer: PackedLinear | Int4Linear | Int8Linear | nn.Linear | nn.Embedding,
                 ) -> None:
        if isinstance(layer, nn.Embedding):
            self.out_features, self.in_features = layer.num_embeddings, layer.embedding_dim
        else:
            self.out_features, self.in_features = layer.out_features, layer.in_features
        if not takes_any_k(layer) and self.in_features % QK:
            raise ValueError(f"in_features {self.in_features} is not a multiple of {QK}")
        self.tensors: list[torch.Tensor] = []
        if isinstance(layer, Int4Linear):
            layer = PackedLinear.from_int4(layer)
        elif isinstance(layer, Int8Linear):
            layer = PackedLinear.from_int8(layer)
        if isinstance(layer, PackedLinear):
            self.struct = layer.struct()
            self.kind = layer.kind
            self.tensors = [t for t in (layer.q, layer.d, layer.m, layer.bias) if t is not None]
            return
        kind = FLOAT_KINDS.get(layer.weight.dtype)
        if kind is None:
            raise ValueError(f"unquantized weights must be fp32, bf16 or fp16, not "
                             f"{layer.weight.dtype}")
        w = layer.weight.detach().contiguous()  # the model's own tensor: nothing is copied
        lb = getattr(layer, "bias", None)
        bias = None if lb is None else lb.detach().float().contiguous()
        self.tensors = [t for t in (w, bias) if t is not None]
        self.kind = kind
        self.struct = _Lin(kind, self.out_features, self.in_features,
                           ctypes.cast(w.data_ptr(), _U8), ctypes.cast(None, _F),
                           ctypes.cast(None, _F),
                           ctypes.cast(None if bias is None else bias.data_ptr(), _F))

    def __call__(self, x: torch.Tensor, threads: int | None = None) -> torch.Tensor:
        """``x`` ``[M, K]`` fp32 -> ``[M, N]`` through the kernel (int16 activations for
        quantized weights on few rows, fp32 otherwise)."""
        lib = load()
        if lib is None:
            raise RuntimeError("native kernels are unavailable on this machine")
        x = x.float().contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        lib.tnd_linear(ctypes.byref(self.struct), ctypes.c_void_p(x.data_ptr()), x.shape[0],
                       ctypes.c_void_p(y.data_ptr()), threads or torch.get_num_threads())
        return y


def unsupported_reason(model: CausalLM, kv_dtype: torch.dtype | None = None,
                       ) -> str | None:
    """Why :class:`FusedForward` cannot run ``model`` (over a KV cache of ``kv_dtype``, when
    given); ``None`` when it can."""
    if load() is None:
        return "native kernels unavailable"
    reason = _unsupported_model(model)
    if reason is not None:
        return reason
    if kv_dtype is not None and kv_dtype not in KV_FORMATS:
        return f"a {kv_dtype} KV cache"
    if kv_dtype in (torch.int8, FP8_DTYPE) and model.arch.mla is not None:
        return f"an {'int8' if kv_dtype == torch.int8 else 'fp8'} latent (MLA) cache"
    dtype = model.norm.weight.dtype  # the model's own float dtype (norms are never quantized)
    if dtype not in FLOAT_KINDS:
        return f"a {dtype} model"
    embed = model.embed_tokens
    if isinstance(embed, PackedEmbedding):
        if embed.table.q.device.type != "cpu":
            return "model is not on the CPU"
    elif embed.weight.dtype not in FLOAT_KINDS:
        return f"the embedding table holds {embed.weight.dtype}"
    elif embed.weight.device.type != "cpu":
        return "model is not on the CPU"
    elif embed.embedding_dim % QK:
        return f"hidden size {embed.embedding_dim} is not a multiple of {QK}"
    linears = [model.lm_head]
    for layer in model.layers:
        attn = layer.self_attn
        linears += [*_attention_linears(attn), *feed_forward_linears(layer.mlp)]
    for lin in linears:
        if not isinstance(lin, _LinTypes) or (lin.in_features % QK and not takes_any_k(lin)):
            return f"{type(lin).__name__} is not a linear layer with K % {QK} == 0"
        if isinstance(lin, nn.Linear) and lin.weight.dtype not in FLOAT_KINDS:
            return f"a linear layer holds {lin.weight.dtype} weights"
        if isinstance(lin, Int4Linear | Int8Linear) and dtype != torch.float32:
            # packing it would copy its weights next to the ones the model holds
            return f"{type(lin).__name__} layers of a {dtype} model are not in the kernels' layout"
    return None


# the gate activations decode_step.cpp computes (silu_mul)
NATIVE_ACTIVATIONS = ("silu",)


def _attention_linears(attn: nn.Module) -> list[nn.Module]:
    """The linears of a layer's attention the kernels read as Lins, o_proj last."""
    if isinstance(attn, MlaAttention):
        return attention_linears(attn)
    return [attn.qkv_proj, attn.o_proj]


def _unsupported_model(model: nn.Module) -> str | None:
    """Why the kernels' model (decode_step.cpp's ModelDesc) cannot describe ``model``."""
    if type(model) not in (CausalLM, MlaCausalLM):
        return f"the kernels compute the decoder of CausalLM, not {type(model).__name__}"
    if model.arch.hidden_act not in NATIVE_ACTIVATIONS:
        return f"hidden_act {model.arch.hidden_act!r}"
    mla = model.arch.mla
    attention = MlaAttention if mla is not None else Attention
    if mla is not None and model.cos_table.shape[-1] != mla.qk_rope_head_dim:
        return "RoPE tables of another width than qk_rope_head_dim"
    for layer in model.layers:
        if type(layer.self_attn) is not attention or type(layer.mlp) not in (MLP, SparseMoE):
            return "a decoder layer other than attention + gated MLP or mixture of experts"
        if mla is not None and (reason := mla_unsupported(layer.self_attn, mla)):
            return reason
        if isinstance(layer.mlp, SparseMoE) and (reason := moe_unsupported(layer.mlp)):
            return reason
    return None


class FusedForward:
    """One-call forward of an fp32, bf16 or fp16 model (quantized or not; dense or with
    routed experts; GQA or latent attention) over the paged KV cache (fp32, bf16, fp16, int8,
    or fp8 under ``kv_scales``: the cache's K and V scales of each layer, as the torch path's
    Fp8KVBackend holds them; the latent cache fp32, bf16 or fp16)."""

    def __init__(self, model: CausalLM, kv_scales: Fp8Scales | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"fused CPU forward unavailable: {reason}")
        lib = load()
        assert lib is not None
        self._lib = lib
        arch = model.arch
        # an fp8 cache's k and v scale of each layer, [2, L] fp32 (the kernels', as torch's
        # fp32 math, in fp32); None: no fp8 cache can be served
        self._fp8_scales: torch.Tensor | None = None
        if kv_scales is not None:
            per_layer = kv_scales.for_layers(arch.num_layers)  # ValueError: another layer count
            table = torch.tensor(per_layer, dtype=torch.float64).T.contiguous()  # [2, L]
            single = table.float()
            for name, values, row in (("k", table[0], single[0]), ("v", table[1], single[1])):
                bad = ~((row * 256).isfinite() & (row > 0))
                if bool(bad.any()):
                    raise ValueError(f"fp8 KV {name}_scale {values[bad][0].item()!r} is not a "
                                     "positive float32 below 2^120")
            self._fp8_scales = single.contiguous()
        self.kv_scales = kv_scales
        self.vocab = arch.vocab_size
        mla_dims = arch.mla
        # the cache's [planes, heads, head vector] per layer (the int8 one's head vectors hold
        # a scale too: storage_head_dim)
        self._kv_heads = ((1, 1, mla_dims.latent_dim) if mla_dims is not None
                          else (2, arch.num_kv_heads, arch.head_dim))
        self.num_layers = arch.num_layers
        self._keep: list[object] = []
        layers = (_Layer * arch.num_layers)()
        dense_width = 0  # the dense MLP layers' width (0: every layer is MoE)
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            mla = moe = None
            o = NativeLinear(attn.o_proj)
            if isinstance(attn, MlaAttention):  # its q/kv_a Lins in place of qkv
                mla = NativeMla(attn, mla_dims, NativeLinear)
                self._keep.extend([mla, *mla.linears])
                qkv = _Lin()
            else:
                qkv_lin = NativeLinear(attn.qkv_proj)
                self._keep.append(qkv_lin)
                qkv = qkv_lin.struct
            if isinstance(mlp, SparseMoE):  # its experts in place of gate_up/down
                moe = NativeMoe(mlp, NativeLinear)
                self._keep.extend([moe, *moe.linears])
                ffn = [_Lin(), _Lin()]
            else:
                dense = [NativeLinear(mlp.gate_up_proj), NativeLinear(mlp.down_proj)]
                self._keep.extend(dense)
                ffn = [lin.struct for lin in dense]
                dense_width = mlp.inter
            self._keep.append(o)
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            layers[i] = _Layer(
                self._f(layer.input_layernorm.weight), self._f(layer.post_attention_layernorm.weight),
                self._f(q_norm.weight if q_norm is not None else None),
                self._f(k_norm.weight if k_norm is not None else None),
                qkv, o.struct, *ffn,
                getattr(attn, "window", None) or 0,  # a sliding window; 0: full attention
                None if moe is None else ctypes.pointer(moe.struct),
                None if mla is None else ctypes.pointer(mla.struct),
            )
        head = NativeLinear(model.lm_head)
        self._keep.extend([head, layers])
        norms = [p for n, p in model.named_parameters() if "norm" in n]
        self._weight_bytes = sum(t.numel() * t.element_size() for lin in [*self._keep]
                                 if isinstance(lin, NativeLinear) for t in lin.tensors)
        self._weight_bytes += sum(t.numel() * t.element_size() for m in self._keep
                                  if isinstance(m, NativeMla) for t in m.tensors)
        self._weight_bytes += sum(p.numel() * 4 for p in norms)  # held in fp32
        cos, sin = model.cos_table.float().contiguous(), model.sin_table.float().contiguous()
        embed = model.embed_tokens
        if isinstance(embed, PackedEmbedding):  # a quantized table, rows dequantized on use
            table = embed.table if embed.table is model.lm_head else NativeLinear(embed.table)
            embed_f, embed_lin = self._f(None), (head if table is model.lm_head else table).struct
            self._keep.append(table)
        elif embed.weight.dtype == torch.float32:
            embed_f, embed_lin = self._f(embed.weight), _Lin()
        else:  # a bf16/fp16 table read in place (a tied lm_head's too), rows widened on use
            table = NativeLinear(embed)
            embed_f, embed_lin = self._f(None), table.struct
            self._keep.append(table)
        # MLA: one latent head; the RoPE tables' width is qk_rope_head_dim
        kv_heads, head_dim = ((1, mla_dims.qk_rope_head_dim) if mla_dims is not None
                              else (arch.num_kv_heads, arch.head_dim))
        desc = _ModelDesc(
            arch.num_layers, arch.hidden_size, arch.num_heads, kv_heads, head_dim,
            dense_width, arch.vocab_size, cos.shape[0], arch.rms_norm_eps,
            embed_f, self._f(cos), self._f(sin),
            self._f(model.norm.weight), head.struct, layers, embed_lin,
            0 if mla_dims is None else mla_dims.latent_dim,
        )
        self._handle = ctypes.c_void_p(lib.tnd_model_create(ctypes.byref(desc)))

    def _f(self, t: torch.Tensor | None) -> object:
        if t is None:
            return ctypes.cast(None, _F)
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return ctypes.cast(t.data_ptr(), _F)

    def weight_bytes(self) -> int:
        """Bytes of weights the forward reads (quantized linears and norms): all of a step's
        for a dense model; a MoE model's every expert, of which a step reads the active ones."""
        return self._weight_bytes

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.tnd_model_free(handle)
            self._handle = None

    @torch.inference_mode()
    def __call__(
        self,
        ids: Sequence[int],
        positions: Sequence[int],
        seq_index: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        kv_cache: torch.Tensor,
        sample_rows: Sequence[int],
        threads: int | None = None,
        layer_hook: Callable[[int], None] | None = None,
        lora: NativeLoraStep | None = None,
    ) -> torch.Tensor:
        """Logits ``[len(sample_rows), V]`` fp32; row r is token ``ids[r]`` at ``positions[r]``
        of sequence ``seq_index[r]`` (whose blocks are ``block_tables[seq_index[r]]``), under
        the LoRA adapter of its slot in ``lora`` when given (tandem/engine/native/lora_step.py).

        ``layer_hook(l)`` runs on this thread once layer l's K/V are in the cache (the prefill
        role pushes them from there); an exception it raises ends the step and is re-raised.

        An fp8 cache is read and written under the forward's ``kv_scales``; without them it is
        refused (its bytes mean nothing without their scales)."""
        int8_kv = kv_cache.dtype == torch.int8
        planes, heads, dim = self._kv_heads
        fp8 = kv_cache.dtype == FP8_DTYPE
        if (kv_cache.dtype not in KV_FORMATS or not kv_cache.is_contiguous()
                or ((int8_kv or fp8) and planes == 1)):
            raise ValueError("the fused forward needs a contiguous fp32, bf16, fp16, int8 or "
                             "fp8 (e4m3) KV cache (the latent cache: fp32, bf16 or fp16)")
        if fp8 and self._fp8_scales is None:
            raise ValueError("an fp8 KV cache needs its scales: FusedForward(model, kv_scales=...)")
        # each layer's k and v scale ([L] fp32 each) for an fp8 cache; unread otherwise
        k_scale, v_scale = ((self._fp8_scales[0].data_ptr(), self._fp8_scales[1].data_ptr())
                            if fp8 and self._fp8_scales is not None else (None, None))
        want = (self.num_layers, planes, heads,
                storage_head_dim(dim, "int8" if int8_kv else "auto"))
        shape = tuple(kv_cache.shape)
        if len(shape) != 6 or (shape[:2] + shape[4:]) != want:
            raise ValueError(f"KV cache of shape {shape} does not fit the model ({want} expected "
                             "for [layers, planes, -, -, heads, head vector])")
        rows = len(ids)
        if not rows or len(positions) != rows or len(seq_index) != rows:
            raise ValueError("ids, positions and seq_index must be non-empty and equally long")
        if min(seq_index) < 0 or max(seq_index) >= len(block_tables):
            raise ValueError("fused forward refused the step: sequence index out of range")
        if lora is not None and lora.rows != rows:
            raise ValueError(f"fused forward refused the step: {lora.rows} LoRA row slots for "
                             f"{rows} rows")
        if sample_rows and (min(sample_rows) < 0 or max(sample_rows) >= rows):
            raise ValueError("fused forward refused the step: sample row out of range")
        width = max(len(t) for t in block_tables)
        # -1 pads short tables: the kernel refuses a position whose block is missing (a block
        # freed behind every layer's sliding window is -1 too, and never needed)
        tables = torch.tensor([list(t) + [-1] * (width - len(t)) for t in block_tables],
                              dtype=torch.int32)
        ids_t = torch.tensor(ids, dtype=torch.int64)
        pos_t = torch.tensor(positions, dtype=torch.int64)
        seq_t = torch.tensor(seq_index, dtype=torch.int32)
        rows_t = torch.tensor(sample_rows, dtype=torch.int32)
        logits = torch.empty(len(sample_rows), self.vocab, dtype=torch.float32)
        raised: list[BaseException] = []

        def done(layer: int) -> int:
            try:
                layer_hook(layer)  # type: ignore[misc]
            except BaseException as exc:  # noqa: BLE001  (re-raised below, after the C call)
                raised.append(exc)
                return 1
            return 0

        callback = _LAYER_DONE(done) if layer_hook is not None else _LAYER_DONE()
        step = _Step(ids_t.data_ptr(), pos_t.data_ptr(), seq_t.data_ptr(), tables.data_ptr(),
                     width, kv_cache.shape[3], kv_cache.shape[2], kv_cache.data_ptr(),
                     KV_FORMATS[kv_cache.dtype], callback,
                     None if lora is None else ctypes.addressof(lora.struct), k_scale, v_scale)
        rc = self._lib.tnd_forward(
            self._handle, ctypes.byref(step), rows, ctypes.c_void_p(rows_t.data_ptr()),
            len(sample_rows), ctypes.c_void_p(logits.data_ptr()),
            threads or torch.get_num_threads(),
        )
        if raised:
            raise raised[0]
        if rc != 0:
            raise ValueError("fused forward refused the step: position, block id or LoRA slot "
                             "out of range")
        return logits
