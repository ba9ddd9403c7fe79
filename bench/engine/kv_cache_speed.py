"""Decode speed by KV cache dtype: float32 against float16 (the CPU default), int8 and fp8.

    .venv/bin/python -m bench.engine.kv_cache_speed [--threads 2] [--rounds 3] [--out docs/bench]

One SmolLM2 engine per KV dtype (engine defaults otherwise: the GGUF's blocks, the fused
native forward), all in this process. Each round runs every shape on every engine, the
engines' order reversed on odd rounds (the VM's speed drifts: a slow minute must not land
on one dtype); the medians over rounds are compared with float32's:

    batched     b sequences of p random prompt tokens, g output tokens each: output tokens
                per second after every prompt is prefilled (bench/vs_llama_cpp/ours.py's
                batched row, 32 x (128 in, 128 out) there)
    one stream  ms per output token of one greedy stream from a short prompt

A decode step reads every running sequence's whole context of K and V; the KV dtype sets how
many bytes that is (float32 4 per value, float16 2, int8 1 plus a 4-byte scale per 64, fp8 1:
e4m3 over per-tensor scales, widened in registers).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.vs_llama_cpp.ours import (
    DECODE_PROMPT,
    batched_decode_tok_s,
    random_prompts,
    stream,
    warm,
)
from tandem.engine import LLM

DTYPES = ("float32", "float16", "int8", "fp8")
SHAPES = ((32, 128, 128), (16, 1000, 48), (4, 2000, 48))  # (sequences, prompt, output)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write kv_cache_speed.json here")
    args = ap.parse_args(argv)
    print(f"loading {len(DTYPES)} SmolLM2 engines ({args.threads} threads)", flush=True)
    llms = {d: LLM("smollm2", progress=False, num_threads=args.threads, kv_cache_dtype=d)
            for d in DTYPES}
    for llm in llms.values():
        warm(llm)
    vocab = llms["float32"].engine.arch.vocab_size
    keys = [f"{b}x{p}+{g}" for b, p, g in SHAPES] + ["one stream ms/token"]
    runs: dict[str, dict[str, list[float]]] = {d: {k: [] for k in keys} for d in DTYPES}
    for rnd in range(args.rounds):
        order = list(DTYPES) if rnd % 2 == 0 else list(DTYPES)[::-1]
        for (b, p, g), key in zip(SHAPES, keys, strict=False):
            prompts = random_prompts(vocab, b, p, seed=10 + rnd)
            for d in order:
                runs[d][key].append(batched_decode_tok_s(llms[d], prompts, g)[0])
                print(f"round {rnd + 1}/{args.rounds} {d:8s} {key:14s} "
                      f"{runs[d][key][-1]:7.1f} tok/s", flush=True)
        for d in order:
            runs[d][keys[-1]].append(stream(llms[d], DECODE_PROMPT, 64).ms_per_token)
            print(f"round {rnd + 1}/{args.rounds} {d:8s} one stream     "
                  f"{runs[d][keys[-1]][-1]:7.2f} ms/token", flush=True)
    medians = {d: {k: statistics.median(v) for k, v in r.items()} for d, r in runs.items()}
    print("\n| shape | " + " | ".join(DTYPES) + " | " +
          " | ".join(f"{d} vs float32" for d in DTYPES[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(DTYPES) - 1))
    for k in keys:
        base = medians["float32"][k]
        # speed: tokens/s over float32's, or float32's ms/token over this one's
        ratio = {d: (medians[d][k] / base if "ms" not in k else base / medians[d][k])
                 for d in DTYPES[1:]}
        print(f"| {k} | " + " | ".join(f"{medians[d][k]:.2f}" for d in DTYPES) + " | " +
              " | ".join(f"{ratio[d]:.3f}x" for d in DTYPES[1:]) + " |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kv_cache_speed.json").write_text(json.dumps(
            {"threads": args.threads, "rounds": args.rounds, "runs": runs,
             "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
