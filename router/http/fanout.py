"""Several generations for one HTTP request: a completions batch, ``n`` choices, ``best_of``.

    prompts x max(n, best_of) samples --expand--> one GenerateRequest each
        sample j of a prompt: seed + j when the request is seeded (n distinct, reproducible
        samples; sample j equals a single request with seed + j)
    run: per prompt, sample 0 goes first; the rest start once it has its first token, so the
        decode worker already holds the prompt's KV and their prefills reuse it (the prefix
        cache: only the blocks after the cached prefix are computed and pushed)
    best_of > n: the n samples with the highest cumulative logprob are the choices

Every sample is a request of its own through the Frontend (admission, limits, metrics); one
that fails stops the others, and the HTTP request fails as a whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from common.tracing import Parent
from protos.tandem.v1 import tandem_pb2
from router.frontend import Frontend
from router.http.openai_request import ApiRequest
from router.request import Accepted

Responses = list[tandem_pb2.GenerateResponse]


def expand(api: ApiRequest) -> list[tandem_pb2.GenerateRequest]:
    """One request per sample, prompt after prompt (``max(n, best_of)`` per prompt)."""
    k = max(api.n, api.best_of)
    out = []
    for request in api.requests:
        for j in range(k):
            sample = tandem_pb2.GenerateRequest()
            sample.CopyFrom(request)
            if j and request.sampling.HasField("seed"):
                sample.sampling.seed = (request.sampling.seed + j) % 2**63
            if api.best_of > api.n:  # ranked by cumulative logprob: every token's is needed
                sample.logprobs.enabled = True
            out.append(sample)
    return out


async def run_all(frontend: Frontend, api: ApiRequest, budget: float | None,
                  parent: Parent = None) -> list[Responses]:
    """Every sample's messages, in ``expand`` order; the best ``n`` per prompt when
    ``best_of`` is larger (then in rank order). ``parent``: the client's trace context."""
    accepted = [frontend.accept(r, parent) for r in expand(api)]  # one bad sample refuses them all
    k = max(api.n, api.best_of)
    tasks: list[asyncio.Future[Responses]] = []
    for p in range(len(api.requests)):
        group = accepted[p * k : (p + 1) * k]
        lead_started = asyncio.Event()
        tasks.append(asyncio.ensure_future(_collect(frontend, group[0], budget, lead_started)))
        tasks += [asyncio.ensure_future(_follow(frontend, a, budget, lead_started, tasks[-1]))
                  for a in group[1:]]
    try:
        results = list(await asyncio.gather(*tasks))
    except BaseException:  # one failed (or the client left): the rest stop too
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if api.best_of == api.n:
        return results
    return [r for p in range(len(api.requests))
            for r in _best(results[p * k : (p + 1) * k], api.n, api.request.logprobs.enabled)]


async def stream_all(frontend: Frontend, api: ApiRequest, budget: float | None,
                     parent: Parent = None
                     ) -> AsyncIterator[tuple[int, tandem_pb2.GenerateResponse]]:
    """The messages of ``n`` samples of one prompt as they come, tagged with their index."""
    accepted = [frontend.accept(r, parent) for r in expand(api)]
    queue: asyncio.Queue[tuple[int, tandem_pb2.GenerateResponse | BaseException | None]] = (
        asyncio.Queue()
    )
    lead_started = asyncio.Event()

    async def pump(i: int, a: Accepted) -> None:
        try:
            if i:
                await _wait_for_lead(lead_started, tasks[0])
            async with aclosing(frontend.generate(a, budget)) as responses:
                async for r in responses:
                    lead_started.set()
                    await queue.put((i, r))
            await queue.put((i, None))
        except BaseException as exc:
            lead_started.set()
            await queue.put((i, exc))
            raise

    tasks = [asyncio.ensure_future(pump(i, a)) for i, a in enumerate(accepted)]
    open_streams = len(tasks)
    try:
        while open_streams:
            i, item = await queue.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(frontend: Frontend, a: Accepted, budget: float | None,
                   started: asyncio.Event | None = None) -> Responses:
    out: Responses = []
    try:
        async with aclosing(frontend.generate(a, budget)) as responses:
            async for r in responses:
                out.append(r)
                if started is not None:
                    started.set()
    finally:
        if started is not None:
            started.set()  # followers go on even if the leader failed (they then fail alike)
    return out


async def _follow(frontend: Frontend, a: Accepted, budget: float | None,
                  lead_started: asyncio.Event, lead: asyncio.Future[Responses]) -> Responses:
    await _wait_for_lead(lead_started, lead)
    return await _collect(frontend, a, budget)


async def _wait_for_lead(started: asyncio.Event, lead: asyncio.Future[Responses]) -> None:
    """Until the leading sample has its first token (or ended)."""
    waiter = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({waiter, lead}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def _best(samples: Sequence[Responses], n: int, keep_logprobs: bool) -> list[Responses]:
    """The n samples with the highest cumulative logprob (ties: the earlier sample)."""
    def score(rs: Responses) -> float:
        return sum(lp.logprob for r in rs for lp in r.logprobs)

    ranked = sorted(range(len(samples)), key=lambda i: (-score(samples[i]), i))[:n]
    out = []
    for i in ranked:
        rs = samples[i]
        if not keep_logprobs:
            for r in rs:
                del r.logprobs[:]
        out.append(rs)
    return out
