"""Several generations for one HTTP request: a completions batch, ``n`` choices, ``best_of``.

    prompts --expand--> one GenerateRequest each, accepted with k = max(n, best_of) sequences
    per prompt: one request through the Frontend (admission by its cost, limits, metrics)
        that the workers prefill and push once and fork into k sequences sharing the prompt's KV blocks
        (tandem/router/handoff/fork.py); sequence j samples with seed + j when the request is seeded
        (k distinct, reproducible samples; sequence j equals a single request with seed + j)
    choice p * k + j: sequence j of prompt p (messages carry j as their index)
    best_of > n: the n sequences with the highest cumulative logprob are the choices

One prompt's request that fails stops the others, and the HTTP request fails as a whole.
The client is charged the whole request at once (``cost``: p prompts x k sequences and every
prompt's tokens); admission charges each prompt's request its own share as it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import replace

from tandem.common.obs.tracing import Parent
from tandem.router.api.request import GenerateRequest
from tandem.router.api.response import ResponseChunk
from tandem.router.async_merge import merge
from tandem.router.cost import NOTHING, Cost, request_cost
from tandem.router.frontend import Frontend
from tandem.router.http.openai_request import ApiRequest
from tandem.router.request import Accepted

Responses = list[ResponseChunk]


def expand(api: ApiRequest) -> list[GenerateRequest]:
    """One request per prompt (each forked into ``max(n, best_of)`` sequences)."""
    if api.best_of <= api.n:
        return list(api.requests)
    # ranked by cumulative logprob: every token's is needed
    return [replace(r, logprobs=replace(r.logprobs, enabled=True)) for r in api.requests]


def sequences(api: ApiRequest) -> int:
    """Sequences per prompt: ``max(n, best_of)``."""
    return max(api.n, api.best_of)


def cost(api: ApiRequest, max_model_len: int) -> Cost:
    """The whole request's cost: every prompt's tokens, each decoded as ``sequences(api)``
    sequences (the sum of what each prompt's request is admitted by)."""
    k = sequences(api)
    total = NOTHING
    for r in api.requests:
        total += request_cost(r.prompt, k, max_model_len)
    return total


def accept_all(frontend: Frontend, api: ApiRequest, parent: Parent = None) -> list[Accepted]:
    """Every prompt's request, accepted with its sequences (one bad prompt refuses them all);
    ``parent``: the client's trace context."""
    k = sequences(api)
    return [frontend.accept(r, n=k, trace_parent=parent) for r in expand(api)]


async def run_all(frontend: Frontend, api: ApiRequest, budget: float | None,
                  parent: Parent = None) -> list[Responses]:
    """Every choice's messages, prompt after prompt (choice ``p * k + j`` is sequence j of
    prompt p); the best ``n`` per prompt when ``best_of`` is larger (then in rank order)."""
    k = sequences(api)
    accepted = accept_all(frontend, api, parent)
    tasks = [asyncio.ensure_future(_collect(frontend, a, budget, k)) for a in accepted]
    try:
        per_prompt = list(await asyncio.gather(*tasks))
    except BaseException:  # one failed (or the client left): the rest stop too
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if api.best_of == api.n:
        return [seq for group in per_prompt for seq in group]
    return [r for group in per_prompt
            for r in _best(group, api.n, api.request.logprobs.enabled)]


async def stream_all(frontend: Frontend, api: ApiRequest, budget: float | None,
                     parent: Parent = None
                     ) -> AsyncIterator[tuple[int, ResponseChunk]]:
    """Every choice's messages as they come, tagged with the choice's index."""
    k = sequences(api)
    accepted = accept_all(frontend, api, parent)
    streams = [frontend.generate(a, budget) for a in accepted]
    async with aclosing(merge(streams)) as merged:
        async for p, r in merged:
            yield p * k + r.index, r


async def _collect(frontend: Frontend, a: Accepted, budget: float | None, k: int
                   ) -> list[Responses]:
    """One prompt's messages, split by sequence."""
    out: list[Responses] = [[] for _ in range(k)]
    async with aclosing(frontend.generate(a, budget)) as responses:
        async for r in responses:
            out[r.index].append(r)
    return out


def _best(samples: Sequence[Responses], n: int, keep_logprobs: bool) -> list[Responses]:
    """The n samples with the highest cumulative logprob (ties: the earlier sample)."""
    def score(rs: Responses) -> float:
        return sum(lp.logprob for r in rs for lp in r.logprobs)

    ranked = sorted(range(len(samples)), key=lambda i: (-score(samples[i]), i))[:n]
    if keep_logprobs:
        return [samples[i] for i in ranked]
    return [[replace(r, logprobs=()) for r in samples[i]] for i in ranked]
