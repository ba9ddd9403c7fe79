"""KV transfer between CUDA caches: GPU -> TCP -> GPU and GPU -> CUDA IPC -> GPU, one run.

    python -m bench.transfer.kv_transfer_gpu [--gib 1.0] [--rounds 3] [--json FILE]

Moves SmolLM2-135M-shaped KV blocks (tandem/profiler/transfer_probe.py's layout: 30 layers,
3 kv heads, head dim 64, bf16, 2,048-token requests of 128 shuffled blocks) from a CUDA cache
in this process to a CUDA cache in a child process, and prints in the same run, rounds
interleaved, medians:

* raw socket ``sendall``/``recv_into`` of the same bytes from host memory on loopback -- the
  baseline a host-staged path is held to,
* our TCP transport between the two CUDA caches (device -> host staging -> socket -> host ->
  device scatter, checksums on, as in production),
* our CUDA IPC transport (the receiver maps the sender's cache; device-to-device copies),
* a device-to-device gather of the same blocks inside one process -- the ceiling for IPC,

with ours / raw and IPC / device-copy as ratios. Needs a CUDA device (``scripts/gpu_check.sh``
runs it on a lent one); exits 2 without one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time

import torch

from bench.transfer.kv_transfer import run_raw
from tandem.profiler.transfer_probe import (
    BLOCKS_PER_REQ,
    LAYOUT,
    SETS,
    Sample,
    block_sets,
    make_cache,
    run_ours,
    say,
)

METHODS = ("raw", "tcp", "cuda_ipc", "device_copy")
LABELS = {"raw": "raw socket (host)", "tcp": "ours TCP (GPU-GPU)",
          "cuda_ipc": "ours CUDA IPC", "device_copy": "device gather"}


def run_device_copy(src: torch.Tensor, n_requests: int) -> Sample:
    """The ceiling: each request's blocks gathered from ``src`` into another cache's blocks
    on the same device (index_select + index_copy_ per request), timed with a synchronize."""
    dst = torch.zeros_like(src)
    src_sets, dst_sets = block_sets(3), block_sets(2)
    idx = [(torch.tensor(s, device=src.device), torch.tensor(d, device=src.device))
           for s, d in zip(src_sets, dst_sets, strict=True)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(n_requests):
        s, d = idx[k % SETS]
        dst.index_copy_(2, d, src.index_select(2, s))
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    nbytes = n_requests * LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    return Sample(nbytes / dt / 1e9, 0.0, 0.0)


async def main(args: argparse.Namespace) -> dict:
    req_bytes = LAYOUT.payload_bytes(LAYOUT.num_layers, BLOCKS_PER_REQ)
    n_requests = max(1, math.ceil(args.gib * (1 << 30) / req_bytes))
    nbytes = n_requests * req_bytes
    say(f"GPU KV transfer bench on {torch.cuda.get_device_name()}: {n_requests} requests x "
        f"{req_bytes / 1e6:.1f} MB = {nbytes / (1 << 30):.2f} GiB per run, {args.rounds} rounds")
    src = make_cache(fill=True, device="cuda")
    samples: dict[str, list[Sample]] = {m: [] for m in METHODS}
    for r in range(args.rounds):
        for m in METHODS:
            if m == "raw":
                sample = await run_raw(nbytes)
            elif m == "device_copy":
                sample = run_device_copy(src, n_requests)
            else:
                sample = await run_ours(m, n_requests, src)
            samples[m].append(sample)
            say(f"round {r + 1} {LABELS[m]:>20}: {sample.gbps:7.2f} GB/s")
    med = {m: statistics.median(s.gbps for s in v) for m, v in samples.items()}
    say("")
    say(f"{'method':>20} | {'GB/s (median)':>13}")
    for m in METHODS:
        say(f"{LABELS[m]:>20} | {med[m]:13.2f}")
    ratios = {"tcp_over_raw": med["tcp"] / med["raw"],
              "ipc_over_device_copy": med["cuda_ipc"] / med["device_copy"]}
    say(f"ours TCP (GPU-GPU) / raw host socket: {ratios['tcp_over_raw']:.2f}x; "
        f"CUDA IPC / device gather: {ratios['ipc_over_device_copy']:.2f}x")
    return {"gbps": med, "all_gbps": {m: [s.gbps for s in v] for m, v in samples.items()},
            "ratios": ratios, "device": torch.cuda.get_device_name(),
            "gib_per_run": nbytes / (1 << 30), "rounds": args.rounds}


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.transfer.kv_transfer_gpu",
                                description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="GiB moved per run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per method")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("kv_transfer_gpu: needs a CUDA device", file=sys.stderr)
        return 2
    result = asyncio.run(main(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
