"""The mixture-of-experts feed-forward of one decoder layer, and the choice between it and the
dense MLP for each layer.

    x --Router--> (weights, ids) --Experts (grouped by expert)--> routed
    x --shared expert (a gated MLP, always on)--> shared  (x sigmoid(x . w_gate): Qwen2-MoE)
    out = routed + shared

One block serves every family: Mixtral (softmax router, no shared expert), Qwen2-MoE
(a shared expert behind a sigmoid gate), Qwen3-MoE (neither), DeepSeek-V2/V3 (their routers,
``n_shared_experts`` shared experts as one MLP of ``n_shared_experts x moe_intermediate_size``,
ungated). What differs is in the arch's :class:`MoeArch` (tandem/engine/models/arch.py).

Parameters (ours; the tensor plan, tandem/engine/models/tensor_plan.py, maps checkpoints'):

    mlp.gate.weight                     [E, hidden]   the router
    mlp.gate.e_score_correction_bias    [E]           DeepSeek-V3 only
    mlp.experts.{e}.gate_up_proj        [2 I, hidden] gate rows, then up rows
    mlp.experts.{e}.down_proj           [hidden, I]
    mlp.shared_expert.gate_up_proj / .down_proj        when shared_intermediate_size > 0
    mlp.shared_expert_gate              [1, hidden]   when shared_expert_gate

Wiring a family (what mixtral.py does; deepseek_v2.py and mla_lm.py the same around MLA):

    spec fields    += its MoE fields (moe_config.py: QWEN_MOE_FIELDS, DEEPSEEK_MOE_FIELDS);
                      inert |= MOE_INERT_FIELDS
    features       Features(..., moe=deepseek_moe(config, 2 or 3))   (or mixtral_moe, qwen_moe)
    decoder layer  self.mlp = feed_forward(arch, i): SparseMoE(arch) on arch.moe.sparse_layers,
                   the dense MLP (intermediate_size) elsewhere; called on [T, hidden]
    weight plan    with_moe(plan, arch, DEEPSEEK_MOE_NAMES)           (tensor_plan.py)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.models.arch import ModelArch, MoeArch
from tandem.engine.models.layers.mlp import MLP
from tandem.engine.models.layers.moe_experts import Experts
from tandem.engine.models.layers.moe_routing import Router


class SparseMoE(nn.Module):
    """Routed experts (+ an optional shared expert) over ``[T, hidden]`` rows.

    ``arch`` gives the hidden size and activation, ``arch.moe`` (required) the rest; a family
    whose decoder is not causal_lm.py's (DeepSeek's latent attention) builds it the same way,
    ``SparseMoE(arch)``, from an arch whose ``moe`` names its routing."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        if arch.moe is None:
            raise ValueError("SparseMoE needs an arch with a MoeArch")
        moe: MoeArch = arch.moe
        self.gate = Router(arch.hidden_size, moe)
        self.experts = Experts(arch, moe.num_experts, moe.expert_intermediate_size)
        # the shared expert is the family's dense MLP at its own width: biased where the
        # family's MLP is (DeepSeek-V2's mlp_bias; no MoE family else has MLP biases)
        self.shared_expert = (MLP(arch, moe.shared_intermediate_size)
                              if moe.shared_intermediate_size else None)
        self.shared_expert_gate = (nn.Parameter(torch.empty(1, arch.hidden_size))
                                   if moe.shared_expert_gate else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(F.linear(x, self.shared_expert_gate)) * shared
            out = out + shared
        return out


def feed_forward(arch: ModelArch, layer: int) -> nn.Module:
    """Layer ``layer``'s feed-forward: the MoE block where ``arch.moe`` makes it sparse, the
    dense gated MLP (``intermediate_size`` wide) elsewhere."""
    if arch.moe is not None and layer in arch.moe.sparse_layers:
        return SparseMoE(arch)
    return MLP(arch)
