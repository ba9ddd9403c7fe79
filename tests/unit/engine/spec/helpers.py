"""Helpers shared by the speculative-decoding tests."""

from __future__ import annotations

import torch


def prompts(lengths: list[int], seed: int = 0, vocab: int = 256) -> list[list[int]]:
    """Random token prompts; a repeated chunk in each so prompt lookup has something to find."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        chunk = torch.randint(3, vocab, (max(1, n // 3),), generator=g).tolist()
        out.append((chunk * 3 + chunk)[:n])
    return out


def run(engine, prompts, params) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Final token ids per prompt, and each request's per-step ``new_token_ids`` chunks.
    ``params`` is one SamplingParams or a list of them (one per prompt)."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    final: dict[str, list[int]] = {}
    chunks: dict[str, list[list[int]]] = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            chunks[out.request_id].append(list(out.new_token_ids))
            if out.finished:
                final[out.request_id] = out.token_ids
    return [final[i] for i in ids], [chunks[i] for i in ids]
