"""The gated feed-forward of one decoder layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.linear import Linear

# hidden_act -> the gate's activation; the family specs refuse any other value by name
ACTIVATIONS = {"silu": F.silu}


class MLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused (optional biases)."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.inter = arch.intermediate_size
        self.act = ACTIVATIONS[arch.hidden_act]
        self.gate_up_proj = Linear(arch.hidden_size, 2 * self.inter, bias=arch.mlp_bias)
        self.down_proj = Linear(self.inter, arch.hidden_size, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(self.act(gate) * up)
