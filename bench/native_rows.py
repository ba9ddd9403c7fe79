"""Where the fused native forward stops paying: step time by query rows, native vs torch.

    python -m bench.native_rows [--rows 1,2,4,8,16,32,64] [--repeats 5]

SmolLM2 int4 (Q4_1 blocks), fp32 activations, one sequence with 256 cached tokens; each step
adds ``rows`` query rows (a decode is 1, speculative verification k+1, a chunk more). The
torch path is the engine's own: torch's int4 kernel below 64 rows, dequantized fp32 GEMM
above. Prints ms per step and the ratio; engine/model_runner.FUSED_MAX_ROWS is set from it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import LLM
from engine.attention import AttentionMetadata


def _torch_step(runner, ids: list[int], start: int, table: list[int]) -> None:
    bs, t = runner.block_size, len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([start + t], dtype=torch.int32),
        block_tables=torch.tensor([table], dtype=torch.int32),
        slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in range(start, start + t)]),
        query_lens_cpu=[t], seq_lens_cpu=[start + t], num_decodes=int(t == 1), block_size=bs,
    )
    with torch.inference_mode():
        h = runner.model(torch.tensor(ids), torch.arange(start, start + t), runner.kv_cache,
                         meta, runner.backend)
        runner.model.compute_logits(h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM("smollm2", progress=False, dtype="float32", quantization="int4", num_blocks=64)
    runner = llm.engine.runner
    if runner.fused is None:
        raise SystemExit("the fused native forward is unavailable here")
    ctx = 256
    table = list(range(1, 1 + (ctx + 128) // runner.block_size + 1))
    print(f"{'rows':>5} {'native ms':>10} {'torch ms':>10} {'torch/native':>13}")
    for rows in [int(r) for r in args.rows.split(",")]:
        ids = list(range(1000, 1000 + rows))
        pos = list(range(ctx, ctx + rows))
        nat, tor = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            runner.fused(ids, pos, [0] * rows, [table], runner.kv_cache, list(range(rows)))
            nat.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _torch_step(runner, ids, ctx, table)
            tor.append(time.perf_counter() - t0)
        n, t = statistics.median(nat) * 1e3, statistics.median(tor) * 1e3
        print(f"{rows:>5} {n:>10.2f} {t:>10.2f} {t / n:>12.2f}x", flush=True)


if __name__ == "__main__":
    main()
