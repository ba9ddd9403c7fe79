"""Give every parameter of a transformers model a non-trivial deterministic value.

transformers initialises biases to zero and norm weights to one, and draws matrices at std
0.02: a forward that drops a bias or a norm matches it anyway. Here every matrix gets
``N(0, 1/fan_in)`` (embeddings ``N(0, 0.3)``: logits are not flat), every bias ``N(0, 0.1)``
and every other vector (norm weights) ``1 + N(0, 0.2)``, so leaving any of them out shows.
Float buffers the checkpoint stores (DeepSeek-V3's router ``e_score_correction_bias``, zero
at initialisation) get ``N(0, 0.1)`` too.
"""

from __future__ import annotations

import torch
from torch import nn


def perturb_parameters(model: nn.Module, seed: int = 0) -> list[str]:
    """Overwrite every parameter (and stored float buffer) of ``model`` in place (the same
    values for the same seed and shapes); returns their names in the order they were drawn."""
    g = torch.Generator().manual_seed(seed)
    names = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                # fan-in is the last dimension (3-D stacked experts included)
                std = 0.3 if "embed" in name else 1.0 / param.shape[-1] ** 0.5
                value = torch.randn(param.shape, generator=g) * std
            elif name.endswith("bias"):
                value = torch.randn(param.shape, generator=g) * 0.1
            else:
                value = 1.0 + torch.randn(param.shape, generator=g) * 0.2
            param.copy_(value.to(param.dtype))
            names.append(name)
        saved = model.state_dict().keys()
        for name, buf in model.named_buffers():
            if name in saved and buf.is_floating_point():  # persistent: in the checkpoint
                buf.copy_((torch.randn(buf.shape, generator=g) * 0.1).to(buf.dtype))
                names.append(name)
    return names
