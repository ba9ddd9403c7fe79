"""Several async streams as one: each item as soon as its stream yields it, tagged with the
stream's index.

The router fans one client request out to several worker streams (the n sequences of a forked
request, the prompts of a batched completions request) and hands the client one stream back.
``merge`` is that: it drains every source in its own task, yields ``(index, item)`` in arrival
order, ends when every source has ended, and fails with the first source's exception (the
others are then cancelled). Leaving the merged stream early (the client went away) cancels
every source too, and waits for them, so no worker stream outlives the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")

_DONE = object()  # a source's end marker in the queue


async def merge(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """``(index of the source, item)`` from every source, as they come (see the module)."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(i: int, source: AsyncIterator[T]) -> None:
        try:
            async with aclosing(source):  # type: ignore[type-var]  # async generators
                async for item in source:
                    queue.put_nowait((i, item))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            queue.put_nowait((i, exc))
            return
        queue.put_nowait((i, _DONE))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(sources)]
    try:
        open_sources = len(tasks)
        while open_sources:
            i, item = await queue.get()
            if item is _DONE:
                open_sources -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item  # type: ignore[misc]  # an item of a source: a T
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
