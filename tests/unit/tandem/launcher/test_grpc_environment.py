"""``tandem local``'s gRPC runtime choice (tandem/launcher/local.py GRPC_EXPERIMENTS): set for
its processes unless the user chose, and still meaning what it says with the gRPC installed
(a gRPC that dropped the choice would read a stream on its thread pool again, and say so)."""

from __future__ import annotations

import os
import subprocess
import sys

from tandem.launcher.local import GRPC_EXPERIMENTS, grpc_environment

# One process serves and reads a stream of small messages; it prints how many times per
# message gRPC's EventEngine pool threads were woken (schedstat's run slices).
_STREAM = r'''
import asyncio, os
import grpc
from grpc.experimental import aio

def pool_slices():
    total = 0
    for t in os.listdir("/proc/self/task"):
        if open(f"/proc/self/task/{t}/comm").read().strip() == "event_engine":
            total += int(open(f"/proc/self/task/{t}/schedstat").read().split()[2])
    return total

async def main():
    async def stream(request, context):
        for _ in range(300):
            yield b"x" * 40
    handler = grpc.method_handlers_generic_handler(
        "t.S", {"S": grpc.unary_stream_rpc_method_handler(stream)})
    server = aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        before, n = pool_slices(), 0
        async for _ in channel.unary_stream("/t.S/S")(b""):
            n += 1
        print((pool_slices() - before) / n)
    await server.stop(None)

asyncio.run(main())
'''


def _pool_wakeups_per_message(env: dict[str, str]) -> tuple[float, str]:
    done = subprocess.run([sys.executable, "-c", _STREAM], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return float(done.stdout.split()[-1]), done.stderr


def test_the_choice_is_set_unless_the_user_made_one() -> None:
    env: dict[str, str] = {}
    grpc_environment(env)
    assert env == {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS}
    mine = {"GRPC_EXPERIMENTS": "event_engine_client"}
    grpc_environment(mine)
    assert mine == {"GRPC_EXPERIMENTS": "event_engine_client"}


def test_with_the_choice_a_stream_no_longer_wakes_the_pool_for_each_message() -> None:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    chosen = dict(base)
    grpc_environment(chosen)
    with_pool, _ = _pool_wakeups_per_message(base)
    without, stderr = _pool_wakeups_per_message(chosen)
    assert "Unknown experiment" not in stderr, stderr
    assert with_pool >= 1.0, f"{with_pool} pool wake-ups a message with gRPC's default"
    assert without < 0.5 * with_pool, (without, with_pool)
