"""Step time by query rows: the fused native forward against the torch path, same weights.

    python -m bench.engine.native_rows [--rows 1,2,4,8,16,32,64] [--repeats 5] [--threads 2]
                                [--weights auto|float32|bfloat16|float16]

``--weights auto`` (the default): SmolLM2 with the GGUF's Q4_1 and Q8_0 blocks on the native
side; the torch side is the same blocks as Int4Linear with the native kernels off (torch's
int4 kernel below 64 rows, dequantized fp32 GEMM above). A dtype: the dense model in that dtype
on both sides (the native side widens 16-bit weights in registers; torch runs its own bf16 /
fp16 ops, with fp32 shadow weights for large steps where the CPU has no bf16 arithmetic).
Two shapes per row count: ``decode`` (``rows`` sequences at 256 cached tokens each, one row
each: a batched decode step) and ``chunk`` (one sequence, ``rows`` query rows after 256
cached tokens: a prefill chunk).
Prints ms per step, tokens/s and the ratio; the tiled path's threshold
(tandem/engine/native/gemm_tiled.h ``TILED_MIN_ROWS``) is read off it.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from tandem.engine import LLM
from tandem.engine.attention import AttentionMetadata

CTX = 256
BLOCKS_PER_SEQ = 24


def _shape(rows: int, mode: str, bs: int) -> tuple[list[int], list[int], list[int],
                                                  list[list[int]]]:
    ids = list(range(1000, 1000 + rows))
    if mode == "decode":
        tables = [list(range(1 + i * BLOCKS_PER_SEQ, 1 + (i + 1) * BLOCKS_PER_SEQ))
                  for i in range(rows)]
        return ids, [CTX] * rows, list(range(rows)), tables
    n = (CTX + rows) // bs + 1
    return ids, list(range(CTX, CTX + rows)), [0] * rows, [list(range(1, 1 + n))]


def _torch_step(runner, ids, pos, seq, tables) -> None:
    bs = runner.block_size
    qlens = [seq.count(i) for i in range(len(tables))]
    seqlens = [max(p for p, s in zip(pos, seq, strict=True) if s == i) + 1
               for i in range(len(tables))]
    starts = [0]
    for q in qlens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seqlens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor([tables[s][p // bs] * bs + p % bs
                                   for p, s in zip(pos, seq, strict=True)]),
        query_lens_cpu=qlens, seq_lens_cpu=seqlens,
        num_decodes=sum(1 for q in qlens if q == 1), block_size=bs,
    )
    with torch.inference_mode():
        h = runner.model(torch.tensor(ids), torch.tensor(pos), runner.kv_cache, meta,
                         runner.backend)
        last = [starts[i + 1] - 1 for i in range(len(tables))]
        runner.model.compute_logits(h[last])


def _time(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--modes", default="decode,chunk")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="auto",
                    choices=["auto", "float32", "bfloat16", "float16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    row_counts = [int(r) for r in args.rows.split(",")]
    modes = args.modes.split(",")
    blocks = max(max(row_counts) * BLOCKS_PER_SEQ if "decode" in modes else 0,
                 (CTX + max(row_counts)) // 16 + 2) + 8
    if args.weights == "auto":
        native_kw = {"dtype": "float32"}
        plain_kw = {"dtype": "float32", "quantization": "int4"}
    else:
        native_kw = plain_kw = {"dtype": args.weights, "quantization": "none"}
    native = LLM("smollm2", progress=False, num_blocks=blocks, **native_kw).engine.runner
    plain = LLM("smollm2", progress=False, num_blocks=blocks, use_native_kernels=False,
                **plain_kw).engine.runner
    if native.fused is None:
        raise SystemExit("the fused native forward is unavailable here")
    print(f"weights {args.weights}: the fused forward reads {native.fused.weight_bytes() / 2**20:.0f}"
          f" MiB a step; threads {args.threads}")
    print(f"{'shape':>7} {'rows':>5} {'native ms':>10} {'tok/s':>7} {'torch ms':>10} "
          f"{'torch/native':>13}")
    for mode in modes:
        for rows in row_counts:
            step = _shape(rows, mode, native.block_size)
            samples = [i for i in range(rows) if mode == "decode" or i == rows - 1]
            n = _time(functools.partial(native.fused, *step, native.kv_cache, samples),
                      args.repeats)
            t = _time(functools.partial(_torch_step, plain, *step), args.repeats)
            print(f"{mode:>7} {rows:>5} {n * 1e3:>10.2f} {rows / n:>7.0f} {t * 1e3:>10.2f} "
                  f"{t / n:>12.2f}x", flush=True)


if __name__ == "__main__":
    main()
