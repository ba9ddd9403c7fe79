"""The pool that parses large HTTP bodies: small ones inline, large ones on its threads, and
a 429 once it holds its bound (a body counts until its thread is done with it)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tandem.router.errors import OverloadedError
from tandem.router.http.body_pool import INLINE_BYTES, ParsePool
from tests.unit.router.harness import until

LARGE = "x" * (INLINE_BYTES + 1)


def test_small_inline_large_in_the_pool_and_bounded() -> None:
    async def scenario() -> None:
        pool = ParsePool(threads=1, queue=1, retry_after_ms=300)
        loop_thread = threading.get_ident()
        try:
            assert await pool.run(lambda t: threading.get_ident(), "x") == loop_thread
            release = threading.Event()
            entered = threading.Event()

            def blocked(text: str) -> int:
                entered.set()
                release.wait(30)
                return len(text)

            first = asyncio.ensure_future(pool.run(blocked, LARGE))
            await until(entered.is_set)  # on the pool's one thread
            second = asyncio.ensure_future(pool.run(len, LARGE))  # waits for the thread
            await until(lambda: pool.pending == 2)
            with pytest.raises(OverloadedError) as err:  # threads + queue are taken
                await pool.run(len, LARGE)
            assert err.value.retry_after_ms == 300 and pool.rejected == 1
            assert await pool.run(len, "small") == 5  # inline: never refused
            first.cancel()  # its client left: the body still counts until its parse ends
            await asyncio.sleep(0)
            assert pool.pending == 2
            with pytest.raises(OverloadedError):
                await pool.run(len, LARGE)
            release.set()
            assert await second == len(LARGE)
            await until(lambda: pool.pending == 0)
            assert await pool.run(lambda t: threading.get_ident(), LARGE) != loop_thread
        finally:
            pool.close()

    asyncio.run(scenario())
