"""The distribution a sampled row draws from, as a tensor (the sampler only draws from it).

Rejection sampling needs p (target) and q (draft) explicitly:

    logits -> min_tokens mask, penalties (target only) -> z = x / T
           -> keep z >= max(top-k cut, top-p cut, min-p cut) -> softmax

The cuts follow ``tandem/engine/sampler.py``: top-p is taken over the top-k renormalized weights when
both are set; ties at a cut are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from tandem.engine.sampler import SamplingState, _apply_penalties, _mask_stop_tokens


def filtered_probs(logits: Tensor, states: Sequence[SamplingState], penalize: bool) -> Tensor:
    """Probabilities ``[R, V]`` (fp32) of sampling each token; rows must not be greedy."""
    x = logits.to(torch.float32, copy=True)  # [R, V]
    if penalize:
        rows = list(range(len(states)))
        min_tok = [
            i for i in rows
            if len(states[i].output_token_ids) < states[i].params.min_tokens
        ]
        rep = [i for i in rows if states[i].params.repetition_penalty != 1.0]
        pf = [
            i for i in rows
            if (states[i].params.presence_penalty or states[i].params.frequency_penalty)
            and states[i].output_token_ids
        ]
        _mask_stop_tokens(x, states, min_tok)
        _apply_penalties(x, states, rep, pf)
    vocab = x.shape[1]
    out = torch.empty_like(x)
    for i, st in enumerate(states):
        p = st.params
        z = x[i] / p.temperature  # [V]
        zs, _ = torch.sort(z, descending=True)
        thr = -math.inf
        keep = vocab
        if 0 < p.top_k < vocab:
            keep = p.top_k
            thr = float(zs[keep - 1])
        if p.top_p < 1.0:
            w = torch.softmax(zs[:keep], dim=0)
            before = torch.nn.functional.pad(w.cumsum(0)[:-1], (1, 0))
            n_keep = int((before < p.top_p).sum())
            thr = max(thr, float(zs[max(n_keep, 1) - 1]))
        if p.min_p > 0.0:
            thr = max(thr, float(zs[0]) + math.log(p.min_p))
        out[i] = torch.softmax(z.masked_fill(z < thr, -math.inf), dim=0)
    return out


def draw(weights: Tensor, u: float) -> int:
    """Index drawn from unnormalized non-negative ``weights`` [V] with the uniform ``u``."""
    cum = weights.to(torch.float64).cumsum(0)
    total = float(cum[-1])
    target = min(u * total, math.nextafter(total, 0.0))
    return int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64),
                                  right=True)[0])
