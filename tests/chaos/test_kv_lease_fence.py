"""Leases and the write fence with the sender in another process (tcp and shm).

- A sender that opened its transfer and then waits (a prefill queued behind others) keeps the
  reservation past its lease on keepalives alone, and commits when it goes on; the same sender
  stopped with SIGSTOP (connected but silent: its socket stays open) loses its next transfer
  after the progress timeout, and the blocks are freed.
- A KV frame whose bytes another process is still sending when the reservation is released
  writes nothing into the blocks, which the decode side has already handed to someone else;
  the connection carries the next transfer to its commit.

Every wait is on a condition (a line from the child, an event, the receiver's stats).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from tandem.kv_transfer import Committed, Expired, Receiver, ReceiverConfig
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    blocks_equal,
    random_cache,
    run,
    settle_and_check,
    tiny_layout,
    zero_cache,
)

LAYOUT = tiny_layout("bfloat16", layers=4)

QUEUED_SENDER = """
import asyncio, sys, time
from tandem.kv_transfer import Endpoint, Sender, SenderConfig
from tandem.kv_transfer.testing import TEST_SECRET, random_cache, tiny_layout
from tandem.kv_transfer.transport import ShmTransport, TcpTransport

async def main():
    layout = tiny_layout("bfloat16", layers=4)
    cfg = SenderConfig(TEST_SECRET)
    transport = ShmTransport(cfg.limits) if sys.argv[2] == "shm" else TcpTransport(cfg.limits)
    tx = Sender(random_cache(layout, 16, seed=7), layout, cfg, [transport])
    endpoint = Endpoint.decode(sys.argv[1])
    line = lambda: asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print("ready", flush=True)
    await line()  # the reservation is made
    t = await tx.open("queued", endpoint, None, [4, 5, 6], time.monotonic() + 60)
    print("opened", flush=True)
    await line()  # queued until the test says go
    t.set_source([1, 2, 3])
    t.push(0, layout.num_layers)
    await t.commit(9, -0.5)
    print("committed", flush=True)
    await line()
    t2 = await tx.open("stopped", endpoint, [1, 2, 3], [8, 9, 10], time.monotonic() + 60)
    await t2.send_layers(0, 1)
    print("pushing", flush=True)
    await line()  # never comes: the test stops, then kills, this process

asyncio.run(main())
"""

LATE_SENDER = """
import asyncio, sys
import torch
from tandem.kv_transfer import Endpoint, Limits
from tandem.kv_transfer.frames import Kind
from tandem.kv_transfer.testing import HandSender, tiny_layout
from tandem.kv_transfer.transport import ShmTransport, TcpTransport

def payload(layout, layers, blocks, seed):
    n = layout.payload_bytes(layers, blocks)
    return torch.randint(0, 256, (n,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed)).numpy().tobytes()

async def main():
    layout = tiny_layout("bfloat16", layers=4)
    transport = ShmTransport(Limits()) if sys.argv[2] == "shm" else TcpTransport(Limits())
    peer = await HandSender.connect(transport, Endpoint.decode(sys.argv[1]), layout)
    line = lambda: asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await peer.send({"kind": Kind.BEGIN, "transfer": "victim", "blocks": [4, 5]})
    rest = await peer.hold_kv("victim", [4, 5], 0, 1, payload(layout, 1, 2, seed=1))
    print("held", flush=True)
    await line()
    await rest()
    await peer.send({"kind": Kind.BEGIN, "transfer": "next", "blocks": [9]})
    await peer.send_kv("next", [9], 0, layout.num_layers, payload(layout, 4, 1, seed=2))
    await peer.send({"kind": Kind.COMMIT, "transfer": "next", "token": 3, "logprob": 0.0})
    while not ((h := await peer.recv())["kind"] == Kind.ACK and h.get("transfer") == "next"):
        pass
    print("done", flush=True)
    await line()
    peer.close()

asyncio.run(main())
"""


def _payload(layers: int, blocks: int, seed: int) -> bytes:
    n = LAYOUT.payload_bytes(layers, blocks)
    return torch.randint(0, 256, (n,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed)).numpy().tobytes()


async def _spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)


async def _expect(proc: asyncio.subprocess.Process, line: bytes) -> None:
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == line


async def _tell(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()  # SIGKILL also ends a stopped process
    await proc.wait()


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_a_queued_sender_keeps_its_lease_and_a_stopped_one_loses_it(kind: str,
                                                                    tmp_path: Path) -> None:
    async def body() -> None:
        # a KEEPALIVE every 0.25 s; a silent bound transfer is cut after 1 s
        cfg = ReceiverConfig(TEST_SECRET, socket_dir=str(tmp_path), progress_timeout_s=1.0)
        rx = Receiver(zero_cache(LAYOUT, 16), LAYOUT, cfg)
        endpoint = await rx.start()
        proc = await _spawn(QUEUED_SENDER, endpoint.encode(), kind)
        try:
            await _expect(proc, b"ready\n")
            rx.reserve("queued", [4, 5, 6], lease_s=1.0)
            await _tell(proc)
            await _expect(proc, b"opened\n")
            # Ten keepalives take at least 2.5 s: two and a half leases, as many progress
            # timeouts, while the sender sits on an open transfer (its prefill "queued").
            stats = await rx.wait_until(lambda s: s.keepalives >= 10, timeout=30)
            assert (stats.reservations, stats.bound_transfers, stats.expired) == (1, 1, 0)
            await _tell(proc)
            await _expect(proc, b"committed\n")
            event = await asyncio.wait_for(rx.events.get(), 10)
            assert isinstance(event, Committed) and event.transfer_id == "queued"
            assert blocks_equal(random_cache(LAYOUT, 16, seed=7), [1, 2, 3], rx.blocks.kv,
                                [4, 5, 6])

            received = rx.stats().bytes_received
            rx.reserve("stopped", [8, 9, 10], lease_s=30)
            await _tell(proc)
            await _expect(proc, b"pushing\n")
            # bound, and its first layer landed: the sender is mid-transfer
            await rx.wait_until(lambda s: s.bound_transfers == 1 and s.bytes_received > received)
            os.kill(proc.pid, signal.SIGSTOP)  # connected, but silent from now on
            event = await asyncio.wait_for(rx.events.get(), 30)
            assert event == Expired("stopped", (8, 9, 10))
            stats = rx.stats()
            assert (stats.reservations, stats.held_blocks, stats.bound_transfers) == (0, 0, 0)
            assert stats.connections == 1  # its socket is still open: only the lease ended
        finally:
            await _kill(proc)
        await settle_and_check(rx)
        await rx.close()

    run(body(), timeout=120)


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_a_late_frame_from_another_process_writes_nothing(kind: str, tmp_path: Path) -> None:
    async def body() -> None:
        dst = zero_cache(LAYOUT, 16)
        dst.view(torch.uint8).fill_(0xA5)
        rx = Receiver(dst, LAYOUT, ReceiverConfig(TEST_SECRET, socket_dir=str(tmp_path)))
        endpoint = await rx.start()
        rx.reserve("victim", [4, 5], lease_s=60)
        proc = await _spawn(LATE_SENDER, endpoint.encode(), kind)
        try:
            await _expect(proc, b"held\n")
            if kind == "tcp":  # the receiver has the header and waits for the payload
                await rx.wait_until(lambda s: s.receiving == 1, timeout=30)
            else:  # the payload is in its slot, half the header on the socket
                await rx.wait_until(lambda s: s.bound_transfers == 1, timeout=30)
            assert rx.release("victim")
            for b in (4, 5):  # the decode worker hands the blocks to another request
                dst.view(torch.uint8)[:, :, b].fill_(0x3C)
            rx.reserve("next", [9], lease_s=60)
            await _tell(proc)  # the rest of the late frame, then a whole transfer
            await _expect(proc, b"done\n")
            event = await asyncio.wait_for(rx.events.get(), 10)
            assert isinstance(event, Committed) and event.transfer_id == "next"
            assert bool((dst.view(torch.uint8)[:, :, 4:6] == 0x3C).all())
            assert bytes(dst[:, :, [9]].contiguous().view(torch.uint8).numpy()) == \
                _payload(LAYOUT.num_layers, 1, seed=2)
            await _tell(proc)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            await _kill(proc)
        await settle_and_check(rx)
        await rx.close()

    run(body(), timeout=120)
