"""KV transfer with a peer process killed (SIGKILL) mid-transfer: the survivor reports it and
ends up holding nothing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tandem.kv_transfer import (
    Aborted,
    ConnectionLost,
    Endpoint,
    Receiver,
    ReceiverConfig,
    Sender,
    SenderConfig,
)
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    deadline,
    random_cache,
    run,
    settle_and_check,
    tiny_layout,
    zero_cache,
)
from tandem.kv_transfer.transport import ShmTransport, TcpTransport

LAYOUT = tiny_layout("bfloat16", layers=4)

SENDER = """
import asyncio, sys, time
from tandem.kv_transfer import Endpoint, Sender, SenderConfig
from tandem.kv_transfer.testing import TEST_SECRET, random_cache, tiny_layout
from tandem.kv_transfer.transport import ShmTransport, TcpTransport

async def main():
    layout = tiny_layout("bfloat16", layers=4)
    cfg = SenderConfig(TEST_SECRET)
    transport = ShmTransport(cfg.limits) if sys.argv[2] == "shm" else TcpTransport(cfg.limits)
    tx = Sender(random_cache(layout, 16), layout, cfg, [transport])
    t = await tx.open("victim", Endpoint.decode(sys.argv[1]), [1, 2, 3], [4, 5, 6],
                      time.monotonic() + 60)
    await t.send_layers(0, 2)
    print("sent", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

asyncio.run(main())
"""

RECEIVER = """
import asyncio, json, sys
from tandem.kv_transfer import Receiver, ReceiverConfig
from tandem.kv_transfer.testing import TEST_SECRET, tiny_layout, zero_cache

async def main():
    layout = tiny_layout("bfloat16", layers=4)
    cfg = ReceiverConfig(TEST_SECRET, socket_dir=sys.argv[1])
    rx = Receiver(zero_cache(layout, 16), layout, cfg)
    endpoint = await rx.start()
    rx.reserve("victim", [4, 5, 6], lease_s=60)
    print(endpoint.encode(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

asyncio.run(main())
"""


async def _spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_sender_killed_mid_transfer(kind: str, tmp_path: Path) -> None:
    async def body() -> None:
        rx = Receiver(zero_cache(LAYOUT, 16), LAYOUT,
                      ReceiverConfig(TEST_SECRET, socket_dir=str(tmp_path)))
        endpoint = await rx.start()
        rx.reserve("victim", [4, 5, 6], lease_s=60)
        proc = await _spawn(SENDER, endpoint.encode(), kind)
        try:
            assert proc.stdout is not None
            assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"sent\n"
            await rx.wait_until(lambda s: s.bound_transfers == 1 and s.bytes_received > 0)
            await _kill(proc)
            event = await asyncio.wait_for(rx.events.get(), 10)
            assert isinstance(event, Aborted) and event.code == "connection_lost"
            assert event.transfer_id == "victim"
        finally:
            await _kill(proc)
        await settle_and_check(rx)
        await rx.close()

    run(body(), timeout=90)


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_receiver_killed_mid_transfer(kind: str, tmp_path: Path) -> None:
    async def body() -> None:
        proc = await _spawn(RECEIVER, str(tmp_path))
        cfg = SenderConfig(TEST_SECRET)
        transport = ShmTransport(cfg.limits) if kind == "shm" else TcpTransport(cfg.limits)
        tx = Sender(random_cache(LAYOUT, 16), LAYOUT, cfg, [transport])
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            endpoint = Endpoint.decode(line.decode().strip())
            t = await tx.open("victim", endpoint, [1, 2, 3], [4, 5, 6], deadline(60))
            await t.send_layers(0, 2)
            await _kill(proc)
            failure = await asyncio.wait_for(t.wait_ended(), 10)
            assert isinstance(failure, ConnectionLost)
            with pytest.raises(ConnectionLost):
                await t.commit(1, 0.0)
        finally:
            await _kill(proc)
        await tx.close()
        stats = tx.stats()
        assert (stats.transfers, stats.connections, stats.buffered_bytes) == (0, 0, 0)

    run(body(), timeout=90)
