"""tandem.router.async_merge: several async streams as one, in arrival order, failing and closing as
one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from tandem.router.async_merge import merge


async def _source(name: str, gates: list[asyncio.Event], closed: list[str],
                  fail_at: int | None = None) -> AsyncIterator[str]:
    """Yields name0, name1, ... each once its gate opens; records that it was closed."""
    try:
        for k, gate in enumerate(gates):
            await gate.wait()
            if k == fail_at:
                raise RuntimeError(f"{name} broke")
            yield f"{name}{k}"
    finally:
        closed.append(name)


def test_items_come_in_the_order_their_streams_yield_them_tagged_by_stream() -> None:
    async def run() -> list[tuple[int, str]]:
        a_gates, b_gates = [asyncio.Event(), asyncio.Event()], [asyncio.Event()]
        closed: list[str] = []
        out: list[tuple[int, str]] = []
        async with aclosing(merge([_source("a", a_gates, closed),
                                   _source("b", b_gates, closed)])) as merged:
            # The test forces the order: b's first item, then a's two.
            b_gates[0].set()
            out.append(await anext(merged))
            a_gates[0].set()
            out.append(await anext(merged))
            a_gates[1].set()
            out += [item async for item in merged]
        assert sorted(closed) == ["a", "b"]
        return out

    assert asyncio.run(run()) == [(1, "b0"), (0, "a0"), (0, "a1")]


def test_the_first_failure_ends_the_merge_and_closes_every_other_stream() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        healthy = [asyncio.Event()]  # never opened: this stream would wait forever
        broken = [asyncio.Event()]
        broken[0].set()
        with pytest.raises(RuntimeError, match="b broke"):
            async with aclosing(merge([_source("a", healthy, closed),
                                       _source("b", broken, closed, fail_at=0)])) as merged:
                async for _ in merged:
                    pass
        return closed

    assert sorted(asyncio.run(run())) == ["a", "b"]


def test_leaving_early_cancels_and_closes_every_stream() -> None:
    async def run() -> tuple[tuple[int, str], list[str]]:
        closed: list[str] = []
        open_gate = asyncio.Event()
        open_gate.set()
        async with aclosing(merge([_source("a", [open_gate, asyncio.Event()], closed),
                                   _source("b", [asyncio.Event()], closed)])) as merged:
            first = await anext(merged)
        return first, closed  # aclosing returned only after both streams were closed

    first, closed = asyncio.run(run())
    assert first == (0, "a0") and sorted(closed) == ["a", "b"]


def test_no_streams_is_an_empty_merge() -> None:
    async def run() -> list[tuple[int, str]]:
        return [item async for item in merge([])]

    assert asyncio.run(run()) == []
