"""Microbenchmark of the CPU weight-only kernels at decode shapes (batch 1).

    .venv/bin/python -m bench.engine.quant_matmul [--threads 2]

1. One 576x1536 matmul (SmolLM2's down_proj: K = 1536 in, N = 576 out) and its transpose
   (gate/up-like: K = 576, N = 1536), 1 row: fp32 (oneDNN), bf16 (F.linear), int8
   (``_weight_int8pack_mm``) and int4 (``_weight_int4pack_mm_for_cpu``, group 32), each with
   bf16 and fp32 activations (the kernels' vectorized path is the bf16 one).
2. The same kernels over a whole SmolLM2-shaped stack of 30 x (qkv 960x576, o 576x576,
   gate_up 3072x576, down 576x1536), distinct weights per layer so the weights stream from
   memory as in a real decode step instead of sitting in cache.
Best of several runs; microseconds per call, milliseconds per stack, and effective GB/s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K) of one decoder layer


def _best(fn: Callable[[], object], reps: int, rounds: int = 5) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def make(kind: str, n: int, k: int, act: torch.dtype) -> tuple[Callable[[], object], int]:
    """A zero-argument call of ``kind`` on a fresh random ``[n, k]`` weight, and its bytes."""
    x = torch.randn(1, k).to(act)
    if kind == "fp32":
        w = torch.randn(n, k)
        return (lambda: torch.ops.mkldnn._linear_pointwise(x.float(), w, None, "none", [], ""),
                w.numel() * 4)
    if kind == "bf16":
        w = torch.randn(n, k).bfloat16()
        return (lambda: torch.nn.functional.linear(x.bfloat16(), w), w.numel() * 2)
    if kind == "int8":
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        s = torch.rand(n).to(act)
        return lambda: torch.ops.aten._weight_int8pack_mm(x, q, s), n * k
    q4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
    sz = torch.rand(k // 32, n, 2).to(act)
    return (lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, q4, 32, sz),
            n * k // 2 + sz.numel() * sz.element_size())


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| kernel | activations | 576x1536 (K=1536) us | 1536x576 (K=576) us |")
    print("|---|---|---|---|")
    for kind in ("fp32", "bf16", "int8", "int4"):
        for act in (torch.bfloat16, torch.float32):
            if kind in ("fp32", "bf16") and act != torch.bfloat16:
                continue
            cells = []
            for n, k in ((576, 1536), (1536, 576)):
                fn, _ = make(kind, n, k, act)
                cells.append(f"{_best(fn, 200) * 1e6:.0f}")
            name = "-" if kind in ("fp32", "bf16") else str(act).removeprefix("torch.")
            print(f"| {kind} | {name} | {cells[0]} | {cells[1]} |")
    print("\n| kernel (bf16 activations) | 30-layer stack ms | weight MB | GB/s |")
    print("|---|---|---|---|")
    for kind in ("fp32", "bf16", "int8", "int4"):
        calls, nbytes = [], 0
        for _ in range(30):
            for n, k in SHAPES:
                fn, b = make(kind, n, k, torch.bfloat16)
                calls.append(fn)
                nbytes += b
        dt = _best(lambda calls=calls: [c() for c in calls], 1)
        print(f"| {kind} | {dt * 1e3:.2f} | {nbytes / 1e6:.1f} | {nbytes / dt / 1e9:.1f} |")


if __name__ == "__main__":
    main()
