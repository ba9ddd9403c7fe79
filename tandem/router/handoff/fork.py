"""The sequences of a forked request, streamed side by side after their one shared leg.

A request with ``n`` > 1 (the HTTP API's ``n`` / ``best_of``) reserves, prefills and pushes
its prompt once; the decode worker forks it into n sequences and streams each on its own
Decode call (by index). Here those n streams are merged into one stream of Chunks tagged
with their index::

    prefill reply (n first tokens) ──> first chunk of 0 .. n-1 (in order, at once)
    Decode(leg, 0) ─┐
    Decode(leg, 1) ─┼──> merged as they come ──> Chunk(index=j)
    Decode(leg, 2) ─┘
        a stream whose worker went away (LegLostError): that sequence alone migrates, as a
        single request with its tokens so far (``migrate``); the others go on

The first failure of any other kind ends the whole merge (the caller's cleanup aborts what
is left); a consumer that stops reading cancels every sequence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

from tandem.router.async_merge import merge
from tandem.router.errors import LegLostError
from tandem.router.request import Chunk

# sequence j's Decode stream on the shared leg, as Chunks
StreamOf = Callable[[int], AsyncIterator[Chunk]]
# sequence j, its tokens so far, why its leg was lost -> its chunks from another worker
Migrate = Callable[[int, list[int], LegLostError], AsyncIterator[Chunk]]


async def merge_sequences(
    firsts: Sequence[Chunk], stream_of: StreamOf, migrate: Migrate
) -> AsyncIterator[Chunk]:
    """Every sequence's chunks, its first chunk (``firsts[j]``, from the prefill reply) before
    the rest; see the module docstring. Ends once every sequence has finished."""
    for chunk in firsts:
        yield chunk

    async def sequence(j: int) -> AsyncIterator[Chunk]:
        sent = list(firsts[j].token_ids)
        try:
            async with aclosing(stream_of(j)) as chunks:
                async for chunk in chunks:
                    sent.extend(chunk.token_ids)
                    chunk.index = j
                    yield chunk
        except LegLostError as lost:
            async with aclosing(migrate(j, sent, lost)) as chunks:
                async for chunk in chunks:
                    chunk.index = j
                    yield chunk

    async with aclosing(merge([sequence(j) for j in range(len(firsts))])) as merged:
        async for _, chunk in merged:
            yield chunk
