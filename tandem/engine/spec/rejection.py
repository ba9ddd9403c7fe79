"""Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): the output is distributed
exactly as the target's, whatever the draft proposes.

    for i, d in drafts:  accept d with probability min(1, p_i(d) / q_i(d))
                         else emit x ~ norm(max(0, p_i - q_i)) and stop
    all accepted:        emit a bonus token x ~ p_k

Every uniform comes from ``uniform()`` (a seeded request passes its own generator), so a
seeded request's speculative output is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tandem.engine.spec.probs import draw


def rejection_sample(
    p: Tensor, q: Tensor, drafts: list[int], uniform: Callable[[], float]
) -> list[int]:
    """Tokens to emit (accepted drafts, then one corrected or bonus token).

    p: [m+1, V] target probabilities after each prefix; q: [m, V] draft probabilities the
    m drafts were drawn from."""
    out: list[int] = []
    for i, d in enumerate(drafts):
        pd, qd = float(p[i, d]), float(q[i, d])
        if uniform() * qd < pd:  # u < p/q: accepted with probability min(1, p/q)
            out.append(d)
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        if float(residual.sum()) <= 0.0:  # p <= q everywhere: only when p == q (float noise)
            residual = p[i]
        out.append(draw(residual, uniform()))
        return out
    out.append(draw(p[len(drafts)], uniform()))
    return out
