"""A multi-head latent attention layer as the fused native forward sees it (``mla_attention.h``).

    MlaAttention (tandem/engine/models/layers/mla.py)    tnd::MlaLayer
        q_proj | q_a_proj, q_b_proj         ->    q_b (q_proj) | q_a, q_b: any Lin kind
        q_a_layernorm.weight                ->    q_a_norm: fp32 (a small copy)
        kv_a_proj_with_mqa                  ->    kv_a: any Lin kind (its bias in the Lin)
        kv_a_layernorm.weight               ->    kv_a_norm: fp32 (a small copy)
        kv_b_proj.weight [nh (nope + vd), R] ->   kv_b: fp32/bf16/fp16, read in place (W_UK and
                                                  W_UV: the absorbed decode's weights, and the
                                                  prefill's decompression by the tiled GEMM)
        o_proj                              ->    the decoder layer's o Lin

Decode rows attend in latent space; a prefill chunk long enough for it
(:meth:`NativeMla.decompresses`: mla_decompress.h's count of products) attends over its context
decompressed through kv_b_proj, as the torch path's prefill rows do (equal in exact
arithmetic). Both read and write the latent cache of one plane and one head of
``kv_lora_rank + qk_rope_head_dim`` values per token, the layout the torch path writes, so
either path continues a sequence the other started (a P/D handoff between them included).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from tandem.engine.models.arch import MlaDims
from tandem.engine.models.layers.mla import LATENT_NORM_EPS, MlaAttention
from tandem.engine.native.build import load
from tandem.engine.native.packed_linear import FLOAT_KINDS, LinStruct

_F = ctypes.POINTER(ctypes.c_float)
_U8 = ctypes.POINTER(ctypes.c_uint8)
_I32 = ctypes.c_int32
MAX_ROPE_DIM = 512  # norm_rope.h: 2 * MAX_ROPE_PAIRS


class MlaLayerStruct(ctypes.Structure):
    """``tnd::MlaLayer`` (mla_attention.h)."""

    _fields_ = [("q_lora_rank", _I32), ("rank", _I32), ("rope", _I32), ("nope", _I32),
                ("v_dim", _I32), ("interleave", _I32), ("scale", ctypes.c_float),
                ("latent_eps", ctypes.c_float), ("q_a", LinStruct), ("q_b", LinStruct),
                ("q_a_norm", _F), ("kv_a", LinStruct), ("kv_a_norm", _F), ("kv_b", LinStruct)]


class _Lin(Protocol):
    """What the fused forward's ``NativeLinear`` gives: the Lin, and the tensors it reads."""

    struct: LinStruct
    tensors: list[torch.Tensor]


def attention_linears(attn: MlaAttention) -> list[nn.Module]:
    """The linear layers of ``attn`` the kernels read as Lins (kv_b_proj aside: read as a
    float matrix, :func:`mla_unsupported`), o_proj last."""
    q = [attn.q_a_proj, attn.q_b_proj] if attn.q_lora else [attn.q_proj]
    return [*q, attn.kv_a_proj_with_mqa, attn.o_proj]


def mla_unsupported(attn: MlaAttention, dims: MlaDims) -> str | None:
    """Why mla_attention.h cannot compute ``attn`` (its Lins are checked with the model's
    other linears); ``None`` when it can."""
    kv_b = attn.kv_b_proj
    if not isinstance(kv_b, nn.Linear) or kv_b.weight.dtype not in FLOAT_KINDS:
        return "a latent attention kv_b_proj that is not an fp32, bf16 or fp16 matrix"
    if dims.qk_rope_head_dim % 2 or dims.qk_rope_head_dim > MAX_ROPE_DIM:
        return f"qk_rope_head_dim {dims.qk_rope_head_dim} (even, at most {MAX_ROPE_DIM})"
    return None


class NativeMla:
    """One MLA layer's ``tnd::MlaLayer`` (:attr:`struct`), holding every tensor it points at;
    ``linear`` turns one of our linear layers into its Lin (the fused forward's
    ``NativeLinear``)."""

    def __init__(self, attn: MlaAttention, dims: MlaDims, linear: Callable[..., _Lin]) -> None:
        reason = mla_unsupported(attn, dims)
        if reason is not None:
            raise ValueError(f"fused CPU forward unavailable: {reason}")
        q = [linear(lin) for lin in attention_linears(attn)[:-1]]  # q_a, q_b | q_proj; kv_a
        *q_lins, kv_a = q
        q_a, q_b = (q_lins if attn.q_lora else [None, q_lins[0]])
        norms = [attn.q_a_layernorm.weight if attn.q_lora else None, attn.kv_a_layernorm.weight]
        q_norm, kv_norm = (None if n is None else n.detach().float().contiguous() for n in norms)
        kv_b = attn.kv_b_proj.weight.detach().contiguous()  # the model's own tensor
        #: the linears the layer reads as Lins (o_proj is the decoder layer's)
        self.linears: list[_Lin] = q
        #: the weights it reads besides its Lins' (kv_b_proj's)
        self.tensors: list[torch.Tensor] = [kv_b]
        self._keep: list[object] = [q_norm, kv_norm, kv_b]
        self.struct = MlaLayerStruct(
            dims.q_lora_rank or 0, dims.kv_lora_rank, dims.qk_rope_head_dim,
            dims.qk_nope_head_dim, dims.v_head_dim, int(dims.rope_interleave),
            dims.softmax_scale, LATENT_NORM_EPS,
            LinStruct() if q_a is None else q_a.struct, q_b.struct,
            ctypes.cast(None if q_norm is None else q_norm.data_ptr(), _F), kv_a.struct,
            ctypes.cast(kv_norm.data_ptr(), _F),
            LinStruct(FLOAT_KINDS[kv_b.dtype], kv_b.shape[0], kv_b.shape[1],
                      ctypes.cast(kv_b.data_ptr(), _U8), ctypes.cast(None, _F),
                      ctypes.cast(None, _F), ctypes.cast(None, _F)),
        )

    def decompresses(self, rows: int, first_position: int) -> bool:
        """Whether the kernels attend a prefill chunk of ``rows`` rows of one sequence, from
        ``first_position`` on, over its context decompressed (else in latent space)."""
        lib = load()
        if lib is None:
            raise RuntimeError("native kernels are unavailable on this machine")
        return bool(lib.tnd_mla_decompresses(ctypes.byref(self.struct), rows, first_position))
