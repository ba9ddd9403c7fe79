"""The KV transfer probe: kv_transfer's own transport, timed between two processes.

Moves SmolLM2-135M-shaped KV blocks (30 layers, 3 kv heads, head dim 64, block size 16,
bf16; 2,048-token requests of 128 blocks, block ids shuffled on both sides by default) from
this process to a ``Receiver`` in a child process, one request after another on one
connection, and reports the throughput and each side's CPU time. ``tandem profile`` fits a
worker's transfer cost from it (``measure_transfer``); bench/transfer/kv_transfer.py compares it with
a raw socket, shared memory and memcpy.

The child is this module run as a program (``run_ours`` starts it):

    python -m tandem.profiler.transfer_probe tcp 8 shuffled     # TRANSPORT REQUESTS ORDER [DEVICE]

(TRANSPORT tcp, shm, shm_unhashed (a receiver that turned shm slot hashes off) or cuda_ipc;
DEVICE cpu by default, or cuda: both caches on the GPU,
moved over TCP staged through host memory, or device to device over CUDA IPC) and speaks
JSON lines on stdout: its endpoint, each reservation, then the landed bytes' digest.
Sender and receiver authenticate with a secret drawn fresh for each run (``new_secret``) and
handed to the child on its stdin: never a built-in value, never on the command line, where
every user of the machine could read it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
import xxhash

from tandem.kv_transfer import KvLayout, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.transport import ShmTransport, TcpTransport, Transport
from tandem.planner.profile import Transfer

LAYOUT = KvLayout("SmolLM2-135M", "bfloat16", "bfloat16", block_size=16, num_layers=30,
                  num_kv_heads=3, head_dim=64)
PROMPT_TOKENS = 2048
BLOCKS_PER_REQ = PROMPT_TOKENS // LAYOUT.block_size  # 128
POOL_BLOCKS = 1024  # per side: 8 disjoint request-sized sets, 377 MB
SETS = POOL_BLOCKS // BLOCKS_PER_REQ
SECRET_BYTES = 32
_MODULE = "tandem.profiler.transfer_probe"
# The folder holding the ``tandem`` package: children run from it, so ``python -m`` finds
# the same package (a checkout's or an install's) as the parent.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def say(msg: str) -> None:
    """One line on stdout, flushed (a child's message to its parent)."""
    print(msg, flush=True)


def block_sets(seed: int, order: str = "shuffled") -> list[list[int]]:
    """SETS disjoint sets of BLOCKS_PER_REQ ids: shuffled (fragmented like a busy cache, the
    default) or contiguous (a fresh cache's best case)."""
    ids = list(range(POOL_BLOCKS))
    if order == "shuffled":
        random.Random(seed).shuffle(ids)
    return [ids[i * BLOCKS_PER_REQ:(i + 1) * BLOCKS_PER_REQ] for i in range(SETS)]


def make_cache(fill: bool, device: str = "cpu") -> torch.Tensor:
    """A POOL_BLOCKS-block cache of LAYOUT on ``device``: random bits (a sender's) or zeros
    (a receiver's; every page touched before timing)."""
    shape = (LAYOUT.num_layers, 2, POOL_BLOCKS, LAYOUT.block_size, LAYOUT.num_kv_heads,
             LAYOUT.head_dim)
    kv = torch.empty(shape, dtype=torch.bfloat16)
    if fill:
        kv.view(torch.int16).random_(-(1 << 15), 1 << 15, generator=torch.Generator().manual_seed(1))
    else:
        kv.zero_()
    return kv.to(device) if device != "cpu" else kv


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def digest(kv: torch.Tensor, ids: list[int]) -> int:
    """A hash of the blocks ``ids`` of ``kv`` (every layer, K and V): equal on both sides
    when the transfer landed every byte where it belongs."""
    blocks = kv[:, :, ids].contiguous().cpu()
    return xxhash.xxh3_64_intdigest(blocks.view(torch.uint8).numpy().tobytes())


def new_secret() -> bytes:
    """A fresh random secret for one run's sender and receiver."""
    return secrets.token_bytes(SECRET_BYTES)


def read_secret(stream: BinaryIO | None = None) -> bytes:
    """The secret the parent wrote on this child's stdin (one hex line); SystemExit without
    one, so a child started by hand cannot run on a guessable key."""
    raw = (stream if stream is not None else sys.stdin.buffer).readline().strip()
    try:
        secret = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) < 16:
        raise SystemExit(f"{_MODULE}: expected the run's secret (hex, >= 16 bytes) on stdin")
    return secret


# -- the child: our receiver ----------------------------------------------------------------------


async def child_ours(secret: bytes, transport: str, n_requests: int, order: str,
                     device: str = "cpu") -> None:
    """Our receiver: reserve request k once request k-2 committed, report each reservation.
    A CUDA cache offers CUDA IPC beside TCP (the sender picks), so ``cuda_ipc`` leaves TCP on."""
    kv = make_cache(fill=False, device=device)
    cfg = ReceiverConfig(secret, enable_tcp=transport in ("tcp", "cuda_ipc"),
                         enable_shm=transport.startswith("shm"),
                         shm_checksum=transport != "shm_unhashed")
    rx = Receiver(kv, LAYOUT, cfg)
    endpoint = await rx.start()
    say(json.dumps({"endpoint": endpoint.encode()}))
    sets = block_sets(seed=2, order=order)
    ahead = 2
    last_ids: list[int] = []
    cpu0 = cpu_s()
    for k in range(min(ahead, n_requests)):
        rx.reserve(f"r{k}", sets[k % SETS], lease_s=600)
        say(json.dumps({"reserved": k}))
    for k in range(n_requests):
        event = await rx.events.get()
        if type(event).__name__ != "Committed":
            raise SystemExit(f"transfer failed: {event}")
        last_ids = list(event.block_ids)
        nxt = k + ahead
        if nxt < n_requests:
            rx.reserve(f"r{nxt}", sets[nxt % SETS], lease_s=600)
            say(json.dumps({"reserved": nxt}))
    cpu = cpu_s() - cpu0
    say(json.dumps({"done": True, "digest": digest(kv, last_ids), "cpu_s": cpu}))
    await rx.wait_until(lambda s: s.connections == 0, timeout=60)
    await rx.close()


# -- the parent side ------------------------------------------------------------------------------


class Child:
    """A child process speaking JSON lines on stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, module: str, *args: str, secret: bytes | None = None) -> Child:
        """``python -m module args...`` from the source root; ``secret``, when given, is
        written to its stdin (hex, one line) and stdin closed."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args,
            stdin=asyncio.subprocess.PIPE if secret is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, cwd=_SOURCE_ROOT)
        if secret is not None:
            assert proc.stdin is not None
            proc.stdin.write(secret.hex().encode("ascii") + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
        return cls(proc)

    async def line(self) -> dict:
        """The child's next JSON line; RuntimeError when it exited instead."""
        assert self.proc.stdout is not None
        raw = await self.proc.stdout.readline()
        if not raw:
            raise RuntimeError(f"child exited with {await self.proc.wait()}")
        return json.loads(raw)

    async def finish(self) -> None:
        """Wait for the child; RuntimeError unless it exited 0."""
        if await self.proc.wait() != 0:
            raise RuntimeError("child failed")


async def start_receiver(transport: str, n_requests: int, order: str, secret: bytes,
                         device: str = "cpu") -> Child:
    """A child running ``child_ours`` for ``n_requests`` requests over ``transport`` into a
    cache on ``device``."""
    return await Child.start(_MODULE, transport, str(n_requests), order, device, secret=secret)


@dataclass(slots=True)
class Sample:
    """One measured run: throughput and each side's CPU seconds per GiB moved."""

    gbps: float
    tx_cpu_per_gib: float
    rx_cpu_per_gib: float


async def run_ours(transport: str, n_requests: int, src_kv: torch.Tensor,
                   order: str = "shuffled") -> Sample:
    """Our transport: n_requests 2,048-token transfers, one after another, on one connection,
    into a receiver's cache on ``src_kv``'s device type (``cuda_ipc``: both on the GPU, the
    CUDA IPC alone: the run fails where it cannot be set up)."""
    secret = new_secret()
    device = src_kv.device.type
    child = await start_receiver(transport, n_requests, order, secret, device)
    endpoint = Endpoint.decode((await child.line())["endpoint"])
    cfg = SenderConfig(secret, max_connections_per_endpoint=1)
    transports: list[Transport]
    if transport == "cuda_ipc":
        from tandem.kv_transfer.transport.cuda_ipc import CudaIpcTransport

        transports = [CudaIpcTransport(cfg.limits)]
    elif transport.startswith("shm"):  # the receiver says whether slots are hashed
        transports = [ShmTransport(cfg.limits)]
    else:
        transports = [TcpTransport(cfg.limits)]
    tx = Sender(src_kv, LAYOUT, cfg, transports)
    src_sets, dst_sets = block_sets(3, order), block_sets(2, order)
    reserved: set[int] = set()
    cpu0, t0 = cpu_s(), time.perf_counter()
    for k in range(n_requests):
        while k not in reserved:
            reserved.add((await child.line())["reserved"])
        if device == "cuda":
            torch.cuda.synchronize()  # the source blocks are final before they are pushed
        await tx.send(f"r{k}", endpoint, src_sets[k % SETS], dst_sets[k % SETS],
                      first_token=1, logprob=-0.1, deadline=time.monotonic() + 120)
    dt, tx_cpu = time.perf_counter() - t0, cpu_s() - cpu0
    while True:
        msg = await child.line()
        if msg.get("done"):
            break
    if msg["digest"] != digest(src_kv, src_sets[(n_requests - 1) % SETS]):
        raise RuntimeError(f"{transport}: landed bytes differ from the source")
    await tx.close()
    await child.finish()
    nbytes = n_requests * LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    gib = nbytes / (1 << 30)
    return Sample(nbytes / dt / 1e9, tx_cpu / gib, msg["cpu_s"] / gib)


def measure_transfer() -> Transfer:
    """kv_transfer's TCP transport over loopback: bandwidth from 8 back-to-back 2,048-token
    requests, the fixed cost from one alone (connection, handshake, first frame)."""
    src = make_cache(fill=True)
    req_bytes = LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    many = asyncio.run(run_ours("tcp", 8, src))
    one = asyncio.run(run_ours("tcp", 1, src))
    bandwidth = many.gbps * 1e9
    latency = max(req_bytes / (one.gbps * 1e9) - req_bytes / bandwidth, 0.0)
    return Transfer(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def main(argv: Sequence[str] | None = None) -> int:
    """The child's entry point: receive ``REQUESTS`` transfers, the secret read from stdin."""
    p = argparse.ArgumentParser(prog=f"python -m {_MODULE}", allow_abbrev=False,
                                description="The receiving side of the KV transfer probe "
                                            "(started by run_ours; the secret comes on stdin).")
    p.add_argument("transport", choices=("tcp", "shm", "shm_unhashed", "cuda_ipc"))
    p.add_argument("requests", type=int)
    p.add_argument("order", choices=("shuffled", "contiguous"))
    p.add_argument("device", nargs="?", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    if (args.transport == "cuda_ipc") and args.device != "cuda":
        p.error("cuda_ipc moves a CUDA cache: give the device cuda")
    if args.transport.startswith("shm") and args.device == "cuda":
        p.error("a CUDA cache moves over tcp or cuda_ipc")
    secret = read_secret()
    asyncio.run(child_ours(secret, args.transport, args.requests, args.order, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
