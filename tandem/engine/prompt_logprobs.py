"""Prompt logprobs: every prompt token's logprob given the tokens before it, plus the top-k.

The row at position p predicts token p + 1, so a prefill chunk over positions [start, end)
scores prompt tokens start + 1 .. end (the last prompt position predicts the first output
token and is the sampling row instead):

    prompt:     t0    t1    t2    t3    t4        chunks [0, 3) and [3, 5)
    row at:     p0    p1    p2  | p3    p4
    scores:     t1    t2    t3  | t4    (samples)
    lps:  [None, lp1,  lp2,  lp3,  lp4]          token 0 has nothing before it

Chunk by chunk the entries land in ``Request.prompt_logprobs``; a prefill recomputed from an
earlier position (preemption) overwrites from there, so any chunking gives the same list.
"""

from __future__ import annotations

import torch

from tandem.engine.core.request import Request
from tandem.engine.outputs import TokenLogprob

_ROWS_PER_SLICE = 256  # bounds the fp32 log_softmax copy of a long chunk: [256, V]


def prompt_rows(req: Request, start: int, num_new_tokens: int) -> range:
    """Positions of this chunk whose logits score a prompt token (empty when the request did
    not ask, or the chunk holds only the last prompt position or later)."""
    if not req.scores_prompt:
        return range(0)
    return range(start, max(start, min(start + num_new_tokens, req.num_prompt_tokens - 1)))


def record_prompt_logprobs(req: Request, start: int, logits: torch.Tensor) -> None:
    """Score the chunk's prompt tokens from its raw ``logits`` ``[m, V]`` (rows at positions
    start .. start + m - 1) into ``req.prompt_logprobs``."""
    lps = req.prompt_logprobs
    assert lps is not None and len(lps) >= start + 1, "prompt chunks are scored in order"
    targets = req.all_token_ids[start + 1 : start + 1 + logits.shape[0]]
    del lps[start + 1 :]
    lps.extend(score_tokens(logits, targets, req.params.prompt_logprobs or 0))


def score_tokens(logits: torch.Tensor, targets: list[int], k: int) -> list[TokenLogprob]:
    """Logprob of ``targets[i]`` under row i of ``logits`` ``[m, V]`` (log_softmax in fp32 of
    the raw scores) and the row's top ``k`` (id, logprob), highest first."""
    out: list[TokenLogprob] = []
    for lo in range(0, len(targets), _ROWS_PER_SLICE):
        rows = logits[lo : lo + _ROWS_PER_SLICE].to(torch.float32)
        ids = torch.tensor(targets[lo : lo + _ROWS_PER_SLICE], device=rows.device)
        lp = torch.log_softmax(rows, dim=-1)  # [r, V]
        chosen = lp.gather(1, ids[:, None]).squeeze(1).tolist()
        top_vals: list[list[float]] = [[] for _ in chosen]
        top_ids: list[list[int]] = [[] for _ in chosen]
        if k:
            top = torch.topk(lp, k, dim=-1)  # sorted, highest first
            top_vals, top_ids = top.values.tolist(), top.indices.tolist()
        for t, value, vals, idx in zip(targets[lo : lo + _ROWS_PER_SLICE], chosen, top_vals,
                                       top_ids, strict=True):
            out.append(TokenLogprob(t, value, list(zip(idx, vals, strict=True))))
    return out
