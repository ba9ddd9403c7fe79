"""KV bytes per token and the transfer time of a 2,048-token prompt: float vs int8 KV.

    .venv/bin/python -m bench.quality.kv_quant [--repeats 9] [--out docs/bench]

SmolLM2-135M's cache shape (30 layers, 3 kv heads, head dim 64, block size 16): a 2,048-token
prompt is 128 blocks. For each KV dtype (bf16, fp32, and int8 = int8 values plus one fp32
scale per head vector, tandem/engine/quant/kv_int8.py) it prints the bytes per token and per prompt,
and the median time to ship the prompt's blocks over our real TCP transport (loopback,
checksums on, as in production): open, push all layers, COMMIT, until the receiver reports
the transfer committed. Sender and receiver share this process and its event loop (the same
for every row, so the ratio is fair; absolute times are pessimistic next to two processes).
Rows are interleaved across repeats because the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from tandem.kv_transfer import KvLayout, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.testing import random_cache, zero_cache
from tandem.kv_transfer.transport import TcpTransport

SECRET = b"bench-kv-quant-0123456789abcdef"
PROMPT_TOKENS = 2048
BLOCK = 16
NBLOCKS = PROMPT_TOKENS // BLOCK


def layouts() -> dict[str, KvLayout]:
    """The SmolLM2-shaped layout for each KV format (int8: 4 scale bytes per head vector)."""
    def make(dtype: str, kv: str, scale: int = 0) -> KvLayout:
        return KvLayout("SmolLM2-135M", dtype, kv, BLOCK, 30, 3, 64, scale_bytes=scale)

    return {"fp32": make("float32", "float32"), "bf16": make("bfloat16", "bfloat16"),
            "int8": make("float32", "int8", 4)}


async def one_transfer(tx: Sender, rx: Receiver, endpoint, layout: KvLayout, k: int) -> float:
    """Seconds to push one prompt's blocks and see them committed on the receiver."""
    ids = list(range(NBLOCKS))
    tid = f"t{k}"
    rx.reserve(tid, ids, lease_s=120)
    t0 = time.perf_counter()
    t = await tx.open(tid, endpoint, ids, ids, time.monotonic() + 120)
    t.push(0, layout.num_layers)
    await t.commit(1, -0.5)
    event = await rx.events.get()
    dt = time.perf_counter() - t0
    if type(event).__name__ != "Committed":
        raise RuntimeError(f"transfer failed: {event}")
    rx.release(tid)
    return dt


async def measure(repeats: int) -> dict[str, dict[str, float]]:
    lays = layouts()
    pairs = {}
    for name, lay in lays.items():
        rx = Receiver(zero_cache(lay, NBLOCKS), lay, ReceiverConfig(SECRET))
        endpoint = await rx.start()
        cfg = SenderConfig(SECRET, max_connections_per_endpoint=1)
        tx = Sender(random_cache(lay, NBLOCKS, seed=1), lay, cfg, [TcpTransport(cfg.limits)])
        pairs[name] = (tx, rx, endpoint)
    times: dict[str, list[float]] = {n: [] for n in lays}
    for k in range(repeats + 1):  # the first round warms connections up, not counted
        for name, (tx, rx, endpoint) in pairs.items():
            dt = await one_transfer(tx, rx, endpoint, lays[name], k)
            if k:
                times[name].append(dt)
    for tx, rx, _ in pairs.values():
        await tx.close()
        await rx.close()
    out = {}
    for name, lay in lays.items():
        prompt = lay.payload_bytes(lay.num_layers, NBLOCKS)
        med = statistics.median(times[name])
        out[name] = {"bytes_per_token": prompt / PROMPT_TOKENS, "prompt_mb": prompt / 1e6,
                     "transfer_ms": 1e3 * med, "gb_s": prompt / med / 1e9}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path, default=None, help="write kv_quant.json here")
    args = ap.parse_args()
    res = asyncio.run(measure(args.repeats))
    print(f"2,048-token prompt, SmolLM2 KV shape, TCP loopback, median of {args.repeats}")
    print("| KV dtype | bytes/token | prompt MB | transfer ms | GB/s | bytes vs bf16 "
          "| time vs bf16 |")
    print("|---|---|---|---|---|---|---|")
    b = res["bf16"]
    for name, r in res.items():
        print(f"| {name} | {r['bytes_per_token']:.0f} | {r['prompt_mb']:.1f} | "
              f"{r['transfer_ms']:.1f} | {r['gb_s']:.2f} | "
              f"{r['bytes_per_token'] / b['bytes_per_token']:.3f}x | "
              f"{r['transfer_ms'] / b['transfer_ms']:.2f}x |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kv_quant.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
