"""A mixture-of-experts layer as the fused native forward sees it (``moe_experts.h``).

    SparseMoE (tandem/engine/models/layers/moe.py)       tnd::MoeLayer
        gate.weight [E, hidden]                    ->    router: a float Lin, read in place
        gate.moe.routing, n_group, topk_group,     ->    routing (tnd::Routing), n_group,
          routed_scaling_factor                          topk_group, routed_scaling
        gate.e_score_correction_bias [E]           ->    correction_bias: fp32 (DeepSeek-V3)
        experts[e].gate_up_proj, .down_proj        ->    gate_up[e], down[e]: any Lin kind
        shared_expert.gate_up_proj, .down_proj     ->    shared_gate_up, shared_down
        shared_expert_gate [1, hidden]             ->    shared_gate: fp32 (a small copy)

The experts' linears become Lins as the dense MLP's do (the fused forward's ``NativeLinear``:
GGUF Q4_0/Q4_1/Q8_0 blocks, int4/int8 and the model's own fp32/bf16/fp16 weights, read in
place), so every weight format the dense path runs serves the experts unchanged. The kernels
compute every router of tandem/engine/models/layers/moe_routing.py: softmax (Mixtral,
Qwen2-MoE, Qwen3-MoE, with ``norm_topk_prob``), DeepSeek-V2's softmax with greedy or
group-limited greedy choice and DeepSeek-V3's sigmoid scores with the bias-corrected grouped
choice, both with routed scaling.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from tandem.engine.models.layers import SparseMoE
from tandem.engine.native.build import load
from tandem.engine.native.packed_linear import FLOAT_KINDS, LinStruct

_F = ctypes.POINTER(ctypes.c_float)
_U8 = ctypes.POINTER(ctypes.c_uint8)
_I32 = ctypes.c_int32


class MoeLayerStruct(ctypes.Structure):
    """``tnd::MoeLayer`` (moe_experts.h)."""

    _fields_ = [("num_experts", _I32), ("top_k", _I32), ("inter", _I32),
                ("norm_topk_prob", _I32), ("routing", _I32), ("n_group", _I32),
                ("topk_group", _I32), ("routed_scaling", ctypes.c_float),
                ("correction_bias", _F), ("router", LinStruct),
                ("gate_up", ctypes.POINTER(LinStruct)), ("down", ctypes.POINTER(LinStruct)),
                ("shared_inter", _I32), ("shared_gate_up", LinStruct),
                ("shared_down", LinStruct), ("shared_gate", _F)]


# MoeArch.routing -> tnd::Routing (moe_experts.h)
ROUTINGS = {"softmax": 0, "deepseek_v2": 1, "deepseek_v3": 2}
MAX_GROUPS = 256  # moe_experts.h's MAX_MOE_GROUPS


class _Lin(Protocol):
    """What the fused forward's ``NativeLinear`` gives: the Lin, and the tensors it reads."""

    struct: LinStruct
    tensors: list[torch.Tensor]


def feed_forward_linears(mlp: nn.Module) -> list[nn.Module]:
    """The linear layers the kernels read for a decoder layer's feed-forward: a dense MLP's
    gate_up/down, or every expert's (and the shared expert's) of a :class:`SparseMoE`."""
    if not isinstance(mlp, SparseMoE):
        return [mlp.gate_up_proj, mlp.down_proj]
    lins = [lin for expert in mlp.experts for lin in (expert.gate_up_proj, expert.down_proj)]
    if mlp.shared_expert is not None:
        lins += [mlp.shared_expert.gate_up_proj, mlp.shared_expert.down_proj]
    return lins


def moe_unsupported(mlp: SparseMoE) -> str | None:
    """Why moe_experts.h cannot compute ``mlp`` (its linears are checked with the dense
    ones); ``None`` when it can."""
    moe = mlp.gate.moe
    if moe.routing not in ROUTINGS:
        return f"{moe.routing} routing"
    if moe.n_group > MAX_GROUPS:
        return f"{moe.n_group} expert groups (at most {MAX_GROUPS})"
    for name, p in (("router", mlp.gate.weight), ("shared expert gate", mlp.shared_expert_gate),
                    ("router correction bias", mlp.gate.e_score_correction_bias)):
        if p is not None and p.dtype not in FLOAT_KINDS:
            return f"a {name} of {p.dtype}"
    return None


class NativeMoe:
    """One MoE layer's ``tnd::MoeLayer`` (:attr:`struct`), holding every tensor it points at;
    ``linear`` turns one of our linear layers into its Lin (the fused forward's
    ``NativeLinear``)."""

    def __init__(self, mlp: SparseMoE, linear: Callable[..., _Lin]) -> None:
        reason = moe_unsupported(mlp)
        if reason is not None:
            raise ValueError(f"fused CPU forward unavailable: {reason}")
        moe = mlp.gate.moe
        router = mlp.gate.weight.detach().contiguous()  # [E, hidden], the model's own tensor
        gate_up = [linear(expert.gate_up_proj) for expert in mlp.experts]
        down = [linear(expert.down_proj) for expert in mlp.experts]
        shared = ([linear(mlp.shared_expert.gate_up_proj), linear(mlp.shared_expert.down_proj)]
                  if mlp.shared_expert is not None else [])
        gate = (None if mlp.shared_expert_gate is None
                else mlp.shared_expert_gate.detach().float().reshape(-1).contiguous())
        bias = mlp.gate.e_score_correction_bias
        bias = None if bias is None else bias.detach().float().contiguous()
        #: every linear the layer reads (the experts', then the shared expert's)
        self.linears: list[_Lin] = [*gate_up, *down, *shared]
        gate_up_table = (LinStruct * len(gate_up))(*(lin.struct for lin in gate_up))
        down_table = (LinStruct * len(down))(*(lin.struct for lin in down))
        self._keep: list[object] = [router, gate, bias, gate_up_table, down_table]
        self.struct = MoeLayerStruct(
            moe.num_experts, moe.top_k, moe.expert_intermediate_size, int(moe.norm_topk_prob),
            ROUTINGS[moe.routing], moe.n_group, moe.topk_group, moe.routed_scaling_factor,
            ctypes.cast(None if bias is None else bias.data_ptr(), _F),
            LinStruct(FLOAT_KINDS[router.dtype], router.shape[0], router.shape[1],
                      ctypes.cast(router.data_ptr(), _U8), ctypes.cast(None, _F),
                      ctypes.cast(None, _F), ctypes.cast(None, _F)),
            gate_up_table, down_table, moe.shared_intermediate_size if shared else 0,
            *([lin.struct for lin in shared] or [LinStruct(), LinStruct()]),
            ctypes.cast(None if gate is None else gate.data_ptr(), _F),
        )

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernels' routing of router logits ``[T, E]``: (weights ``[T, k]`` fp32, expert
        ids ``[T, k]`` int64), as the forward routes (the torch path's
        :class:`~tandem.engine.models.layers.moe_routing.Router` returns the same)."""
        lib = load()
        if lib is None:
            raise RuntimeError("native kernels are unavailable on this machine")
        m = self.struct
        if logits.dim() != 2 or logits.shape[1] != m.num_experts:
            raise ValueError(f"logits of shape {tuple(logits.shape)}: [T, {m.num_experts}] "
                             "expected")
        x = logits.detach().float().contiguous()
        ids = torch.empty(x.shape[0], m.top_k, dtype=torch.int32)
        weights = torch.empty(x.shape[0], m.top_k, dtype=torch.float32)
        lib.tnd_moe_route(ctypes.byref(m), ctypes.c_void_p(x.data_ptr()), x.shape[0],
                          ctypes.c_void_p(ids.data_ptr()), ctypes.c_void_p(weights.data_ptr()))
        return weights, ids.long()
