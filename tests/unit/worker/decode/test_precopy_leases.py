"""A held pre-copy's lease: expired once, at its time or at a drain's start, never twice."""

from __future__ import annotations

import asyncio

from tandem.worker.decode.precopy_leases import PreCopyLeases


def test_a_drain_expires_every_held_precopy_once() -> None:
    async def scenario() -> list[str]:
        expired: list[str] = []
        leases = PreCopyLeases(expired.append)
        leases.start("a", 600.0)
        leases.start("b", 600.0)
        leases.start("c", 600.0)
        leases.forget("c")  # its streams ended first
        leases.expire_all()
        leases.expire_all()  # nothing left: no second expiry
        leases.start("d", 0.0)
        while "d" not in expired:  # the loop runs the due timer
            await asyncio.sleep(0)
        return expired

    assert asyncio.run(scenario()) == ["a", "b", "d"]
