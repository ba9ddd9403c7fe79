"""Large HTTP bodies are parsed off the event loop, in a bounded pool.

    body <= INLINE_BYTES   decoded, checked and parsed on the event loop (microseconds)
    larger                 the same work on one of ``threads`` threads; at most ``queue``
                           more wait for one, beyond that 429 with a Retry-After

Decoding, checking and parsing a multi-megabyte body takes tens to hundreds of milliseconds;
on the event loop all of it is taken from every stream the router serves. In a thread the
loop gets the interpreter back every few milliseconds (Python's switch interval) through
the checks and the parse; only ``json.loads`` itself, one C call, holds it for its whole run
(some tens of milliseconds for a body at the 4 MiB limit), so the loop waits at most that
long at a time, not for a whole flood. The pool's bound keeps a flood of large bodies from
queueing without end: a body counts against the bound until its thread is done with it, even
if its client left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tandem.router.errors import OverloadedError

_T = TypeVar("_T")

INLINE_BYTES = 64 * 1024


class ParsePool:
    """``run(fn, text)``: ``fn(text)`` inline for a small body, else in the pool."""

    def __init__(self, threads: int, queue: int, retry_after_ms: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="router-parse")
        self.limit = threads + queue
        self.retry_after_ms = retry_after_ms
        self.pending = 0  # bodies handed to the pool and not yet done with
        self.rejected = 0

    async def run(self, fn: Callable[[str], _T], text: str) -> _T:
        """``fn(text)``, off the event loop when ``text`` is large; OverloadedError when the
        pool already holds its bound."""
        if len(text) <= INLINE_BYTES:
            return fn(text)
        if self.pending >= self.limit:
            self.rejected += 1
            raise OverloadedError(
                f"router busy parsing {self.pending} large request bodies; retry",
                self.retry_after_ms)
        loop = asyncio.get_running_loop()
        self.pending += 1
        future = self._pool.submit(fn, text)
        future.add_done_callback(lambda _: _soon(loop, self._done))
        return await asyncio.wrap_future(future)

    def _done(self) -> None:
        self.pending -= 1

    def close(self) -> None:
        """Stop the threads (a parse still running finishes on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """``fn`` on ``loop``'s thread (from a pool thread); nothing once the loop is closed."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(fn)
