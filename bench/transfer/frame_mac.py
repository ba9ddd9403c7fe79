"""What the per-frame MACs cost on the KV transfer's TCP path: one process, loopback.

    python -m bench.transfer.frame_mac [--mib 512] [--rounds 3]

Moves SmolLM2-135M-shaped KV frames (one layer of a 2,048-token request: 128 shuffled blocks,
1.5 MiB a frame, what the prefill worker pushes layer by layer) through a pair of
``SocketChannel``s on TCP loopback, once unsealed (no MAC and no checksum: the framing TLS
uses, whose records authenticate themselves) and once sealed (frame_mac.py: an HMAC-SHA256
header tag, an AES-GMAC payload tag), rounds interleaved, and prints the median bytes/s of
each and, for the choice of MAC, each candidate alone over the frame as the channel feeds it
(staging chunks of 512 KiB, gathered once, untimed). Sender and receiver share one event loop
here, so both MACs are on one core: a worst case for the ratio (across two processes each side
computes its own on its own core).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import random
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.poly1305 import Poly1305

from tandem.kv_transfer.blocks import KvBlocks, RecvSpan, SendSpan, chunk_bytes
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.frame_mac import session_keys
from tandem.kv_transfer.frames import HeaderCodec, Kind
from tandem.kv_transfer.transport.sockets import SocketChannel, tune_socket
from tandem.profiler.transfer_probe import BLOCKS_PER_REQ, LAYOUT, POOL_BLOCKS, make_cache

FRAME_BLOCKS = BLOCKS_PER_REQ


async def _pair() -> tuple[SocketChannel, SocketChannel]:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    lsock.setblocking(False)
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setblocking(False)
    connecting = loop.create_task(loop.sock_connect(client, lsock.getsockname()))
    server, _ = await loop.sock_accept(lsock)
    await connecting
    lsock.close()
    codec = HeaderCodec(Limits())
    for s in (client, server):
        tune_socket(s, 4 << 20)
    return (SocketChannel(client, codec, 64 << 20, "tcp", "tx"),
            SocketChannel(server, codec, 64 << 20, "tcp", "rx"))


async def one_round(src: KvBlocks, dst: KvBlocks, nbytes: int, sealed: bool) -> float:
    """Bytes/s of ``nbytes`` of KV frames through a fresh channel pair."""
    tx, rx = await _pair()
    if sealed:
        tx.start_macs(session_keys(b"k" * 32, b"s" * 16, b"r" * 16, "fp", sender=True))
        rx.start_macs(session_keys(b"k" * 32, b"s" * 16, b"r" * 16, "fp", sender=False))
    rng = random.Random(0)
    frame = LAYOUT.payload_bytes(1, FRAME_BLOCKS)
    frames = max(1, nbytes // frame)
    plans = []
    for i in range(frames):
        ids = rng.sample(range(POOL_BLOCKS), FRAME_BLOCKS)
        layer = i % LAYOUT.num_layers
        plans.append((layer, ids))

    async def send() -> None:
        for layer, ids in plans:
            header = {"kind": Kind.KV, "transfer": "t", "layers": [layer, layer + 1],
                      "blocks": ids, "dtype": LAYOUT.kv_dtype,
                      "shape": LAYOUT.payload_shape(1, len(ids)), "nbytes": frame}
            await tx.send(header, SendSpan(src, layer, layer + 1, ids))

    async def receive() -> None:
        for layer, ids in plans:
            header = await rx.recv()
            assert await rx.recv_payload(header, RecvSpan(dst, layer, layer + 1, ids), _alive)

    t0 = time.perf_counter()
    await asyncio.gather(send(), receive())
    seconds = time.perf_counter() - t0
    tx.close()
    rx.close()
    return frames * frame / seconds


def _alive() -> bool:
    return True


class _Gmac:
    """AES-256-GMAC with ``update`` (what frame_mac.FrameSeal computes)."""

    def __init__(self) -> None:
        self._e = Cipher(algorithms.AES(b"k" * 32), modes.GCM(b"n" * 12)).encryptor()

    def update(self, data: Any) -> None:
        self._e.authenticate_additional_data(data)


def hash_rates(src: KvBlocks) -> dict[str, float]:
    """GB/s of each candidate over one frame's staging chunks (no I/O)."""
    ids = random.Random(1).sample(range(POOL_BLOCKS), FRAME_BLOCKS)
    bounce = np.empty(chunk_bytes(LAYOUT.block_bytes), dtype=np.uint8)
    views = [c.copy() for c in SendSpan(src, 0, 1, ids).chunks(bounce)]
    nbytes = sum(v.nbytes for v in views)
    makers: dict[str, Callable[[], Any]] = {
        "xxh3_64": xxhash.xxh3_64,
        "hmac_sha256": lambda: hmac.new(b"k" * 32, None, hashlib.sha256),
        "blake2b_keyed": lambda: hashlib.blake2b(key=b"k" * 32, digest_size=16),
        "poly1305": lambda: Poly1305(b"k" * 32),
        "aes256_gmac": lambda: _Gmac(),
    }
    rates = {}
    for name, make in makers.items():
        reps = 10
        t0 = time.perf_counter()
        for _ in range(reps):
            h = make()
            for v in views:
                h.update(v)
        rates[name] = reps * nbytes / (time.perf_counter() - t0) / 1e9
    return rates


async def main(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    src = KvBlocks(make_cache(True), LAYOUT)
    dst = KvBlocks(make_cache(False), LAYOUT)
    nbytes = args.mib << 20
    results: dict[str, list[float]] = {"unsealed": [], "sealed": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(await one_round(src, dst, nbytes, name == "sealed"))
    frame = LAYOUT.payload_bytes(1, FRAME_BLOCKS)
    print(f"frame: {FRAME_BLOCKS} blocks x 1 layer = {frame / 2**20:.2f} MiB; "
          f"{args.mib} MiB a round, {args.rounds} rounds, median:")
    for name, rates in results.items():
        print(f"  {name:12s} {statistics.median(rates) / 1e9:6.2f} GB/s")
    base, sealed = (statistics.median(results[k]) for k in ("unsealed", "sealed"))
    print(f"  sealed/unsealed: {sealed / base:.2f}")
    print("hash alone, GB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in hash_rates(src).items()))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="MiB per round")
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
