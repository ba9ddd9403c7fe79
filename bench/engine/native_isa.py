"""The native forward's ISA variants (avx2 vs avx512) on the same model, in one process.

    python -m bench.engine.native_isa [--shapes decode1,decode32,prefill512] [--repeats 7]
                               [--threads 2] [--model smollm2]

Builds the model once (``engine.LLM``, ``--quantization auto``: SmolLM2's GGUF Q4_1 linears
and Q8_0 embedding as stored) and one fused forward per variant this CPU runs
(tandem/engine/native/build.py ``open_variant``), sharing the weights and the KV cache. Shapes:
``decode1`` (one sequence at 256 cached tokens, one row: a single-stream decode step),
``decode32`` (32 such sequences, one row each: a batched decode step), ``prefill512`` (one
512-token chunk from position 0). Each repeat times every variant once (the order alternating
between repeats) as the median of ``--inner`` calls, so a slow spell of this shared VM hits
both; prints each variant's range and median over the repeats and the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

from tandem.engine import LLM
from tandem.engine.native import fused_forward
from tandem.engine.native.build import cpu_flags, open_variant, selected_isa, supported_isas

CTX = 256
BLOCKS_PER_SEQ = 24


def _shape(name: str, bs: int):
    if name.startswith("decode"):
        rows = int(name[len("decode"):])
        tables = [list(range(1 + i * BLOCKS_PER_SEQ, 1 + (i + 1) * BLOCKS_PER_SEQ))
                  for i in range(rows)]
        return list(range(1000, 1000 + rows)), [CTX] * rows, list(range(rows)), tables, \
            list(range(rows))
    rows = int(name[len("prefill"):])
    n = rows // bs + 1
    return (list(range(1000, 1000 + rows)), list(range(rows)), [0] * rows,
            [list(range(1, 1 + n))], [rows - 1])


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="decode1,decode32,prefill512")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5, help="calls per timing (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = args.shapes.split(",")
    blocks = max(32 * BLOCKS_PER_SEQ, 600) + 8
    runner = LLM(args.model, progress=False, num_blocks=blocks, dtype="float32").engine.runner
    if runner.fused is None:
        raise SystemExit("the fused native forward is unavailable here")
    isas = supported_isas(cpu_flags())
    fused = {}
    for isa in isas:
        lib = open_variant(isa)
        if lib is None:
            raise SystemExit(f"the {isa} variant did not build or load")
        with mock.patch.object(fused_forward, "load", lambda lib=lib: lib):
            fused[isa] = fused_forward.FusedForward(runner.model)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    print(f"{cpu}; threads {args.threads}; variants {', '.join(isas)} (engine default: "
          f"{selected_isa()}); {fused[isas[0]].weight_bytes() / 2**20:.0f} MiB "
          f"of weights a step; {args.repeats} repeats x median of {args.inner} calls")
    for name in shapes:
        ids, pos, seq, tables, samples = _shape(name, runner.block_size)
        times: dict[str, list[float]] = {isa: [] for isa in isas}
        for f in fused.values():  # warm
            f(ids, pos, seq, tables, runner.kv_cache, samples)
        for r in range(args.repeats):
            for isa in (isas if r % 2 == 0 else isas[::-1]):
                calls = []
                for _ in range(args.inner):
                    t0 = time.perf_counter()
                    fused[isa](ids, pos, seq, tables, runner.kv_cache, samples)
                    calls.append(time.perf_counter() - t0)
                times[isa].append(statistics.median(calls))
        rows = len(ids)
        for isa in isas:
            t = times[isa]
            print(f"{name:>11} {isa:>7}: {min(t) * 1e3:8.2f}-{max(t) * 1e3:8.2f} ms "
                  f"(median {statistics.median(t) * 1e3:8.2f} ms, "
                  f"{rows / statistics.median(t):8.1f} tok/s)")
        if len(isas) == 2:
            ratios = [a / b for a, b in zip(times[isas[1]], times[isas[0]], strict=True)]
            print(f"{name:>11} {isas[1]}/{isas[0]} time per repeat: "
                  f"{min(ratios):.3f}-{max(ratios):.3f} (median {statistics.median(ratios):.3f})",
                  flush=True)


if __name__ == "__main__":
    main()
