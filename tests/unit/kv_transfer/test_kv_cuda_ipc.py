"""CUDA caches: device-to-device over CUDA IPC (two processes) and staged over TCP.

Runs only where a GPU is present; skipped otherwise, never faked.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch

from tandem.kv_transfer import Committed, Endpoint, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    blocks_digest,
    blocks_equal,
    deadline,
    random_cache,
    run,
    settle_and_check,
    tiny_layout,
    zero_cache,
)
from tandem.kv_transfer.transport import TcpTransport

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

RECEIVER = """
import asyncio, json, sys
import torch
from tandem.kv_transfer import Receiver, ReceiverConfig
from tandem.kv_transfer.testing import TEST_SECRET, blocks_digest, tiny_layout, zero_cache

async def main():
    layout = tiny_layout(sys.argv[1], layers=4)
    kv = zero_cache(layout, 32).cuda()
    rx = Receiver(kv, layout, ReceiverConfig(TEST_SECRET, enable_shm=False))
    endpoint = await rx.start()
    assert endpoint.address("cuda_ipc")
    rx.reserve("gpu", [9, 3, 17, 4], lease_s=60)
    print(json.dumps({"endpoint": endpoint.encode()}), flush=True)
    event = await rx.events.get()
    print(json.dumps({"event": type(event).__name__,
                      "digest": blocks_digest(kv, [9, 3, 17, 4])}), flush=True)
    await rx.wait_until(lambda s: s.connections == 0, 30)
    await rx.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_ipc_round_trip_between_processes(dtype: str) -> None:
    import json

    async def body() -> None:
        layout = tiny_layout(dtype, layers=4)
        src = random_cache(layout, 32, seed=9).cuda()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", RECEIVER, dtype,
                                                    stdout=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            endpoint = Endpoint.decode(first["endpoint"])
            tx = Sender(src, layout, SenderConfig(TEST_SECRET))
            t = await tx.open("gpu", endpoint, [1, 2, 30, 31], [9, 3, 17, 4], deadline(60))
            assert t.conn.channel.transport == "cuda_ipc"
            for layer in range(layout.num_layers):
                torch.cuda.synchronize()  # the layer's KV is final before it is pushed
                t.push(layer, layer + 1)
            await t.commit(4, -0.5)
            await tx.close()
            done = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            assert done["event"] == "Committed"
            assert done["digest"] == blocks_digest(src, [1, 2, 30, 31])
            assert tx.stats().transfers == 0
        finally:
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except asyncio.TimeoutError:  # stuck (the test failed first): never leave it
                    proc.kill()
                    await proc.wait()
                    raise
        assert proc.returncode == 0

    run(body(), timeout=240)


def test_cuda_cache_over_tcp_is_staged_through_host_memory() -> None:
    async def body() -> None:
        layout = tiny_layout("bfloat16", layers=3)
        src, dst = random_cache(layout, 16, seed=1).cuda(), zero_cache(layout, 16).cuda()
        cfg_rx, cfg_tx = ReceiverConfig(TEST_SECRET), SenderConfig(TEST_SECRET)
        rx = Receiver(dst, layout, cfg_rx, [TcpTransport(cfg_rx.limits)])
        endpoint = await rx.start()
        tx = Sender(src, layout, cfg_tx, [TcpTransport(cfg_tx.limits)])
        rx.reserve("staged", [5, 0], lease_s=30)
        await tx.send("staged", endpoint, [7, 8], [5, 0], first_token=1, logprob=0.0,
                      deadline=deadline())
        assert isinstance(await rx.events.get(), Committed)
        assert blocks_equal(src, [7, 8], dst, [5, 0])
        await settle_and_check(rx, tx)
        await rx.close()

    run(body())
