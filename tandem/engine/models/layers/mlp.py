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
    """``down(act(gate(x)) * up(x))`` with gate and up fused (optional biases).

    ``intermediate_size`` / ``bias`` default to the arch's dense MLP; a mixture-of-experts
    block builds its experts with their own width and no bias."""

    def __init__(self, arch: ModelArch, intermediate_size: int | None = None,
                 bias: bool | None = None) -> None:
        super().__init__()
        self.inter = arch.intermediate_size if intermediate_size is None else intermediate_size
        bias = arch.mlp_bias if bias is None else bias
        self.act = ACTIVATIONS[arch.hidden_act]
        self.gate_up_proj = Linear(arch.hidden_size, 2 * self.inter, bias=bias)
        self.down_proj = Linear(self.inter, arch.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(self.act(gate) * up)
