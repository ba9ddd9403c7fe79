"""fp8 (e4m3) KV against float16 KV on the default model: perplexity and greedy agreement.

    .venv/bin/python -m bench.quality.fp8_kv [--tokens 0] [--out docs/bench]

SmolLM2-135M-Instruct from its Q4_1 GGUF (the default model, weights as stored), one row per
KV cache dtype, all on the torch path (``use_native_kernels=False``: every row runs the same
ops and only the cache differs; the fused native forward serves each of these caches too, to
its own summation order):

    fp16-kv   the float16 cache (the CPU default's dtype)      the reference
    fp8-kv    e4m3 over per-tensor scales (1.0 for K and V: tandem/engine/quant/kv_fp8.py)
    int8-kv   int8 with an fp32 scale per head vector (kv_int8.py), for comparison

Perplexity runs tests/data/ppl_text.txt as one sequence in prefill chunks of ``--chunk``
tokens over a private cache of the row's dtype (bench/quality/perplexity.py ``token_nlls``):
later chunks attend over the cached K/V, so the cache's rounding is in the number. Greedy
agreement: the prompt set of tests/unit/engine/test_smollm2.py, 24 greedy tokens each
through the engine, against the fp16-kv row. Quality only, no timing: the numbers do not
depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from bench.quality.perplexity import MAX_NEW, TEXT, agreement, greedy, token_nlls
from tandem.engine.config import EngineConfig
from tandem.engine.llm_engine import LLMEngine

ROWS = {"fp16-kv": "float16", "fp8-kv": "fp8", "int8-kv": "int8"}
COMMAND = ".venv/bin/python -m bench.quality.fp8_kv --out docs/bench"


def make_engine(kv: str, model: str, threads: int) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, num_blocks=512, num_threads=threads,
                                      kv_cache_dtype=kv, use_native_kernels=False)
    return LLMEngine(config, progress=False)


def measure(model: str, tokens: int, chunk: int, threads: int) -> dict[str, dict[str, float]]:
    from tests.unit.engine.test_smollm2 import _prompts  # the engine tests' prompt set

    results: dict[str, dict[str, float]] = {}
    nlls: dict[str, torch.Tensor] = {}
    ref: list[list[int]] | None = None
    for row, kv in ROWS.items():
        engine = make_engine(kv, model, threads)
        ids = engine.tokenizer.encode(TEXT.read_text())
        ids = ids[:tokens] if tokens else ids
        nlls[row] = token_nlls(engine.runner, ids, chunk)
        out = greedy(engine, _prompts(engine.tokenizer))
        ref = out if ref is None else ref
        cache = engine.runner.kv_cache
        results[row] = {"tokens": len(ids), "ppl": math.exp(nlls[row].mean().item()),
                        "kv_bytes_per_token": cache[:, :, 0, 0].numel() * cache.element_size(),
                        "prompts": len(out), **agreement(ref, out),
                        "mean_abs_nll_delta": (nlls[row] - nlls["fp16-kv"]).abs().mean().item()}
    return results


def table(results: dict[str, dict[str, float]]) -> str:
    ref = results["fp16-kv"]["ppl"]
    lines = ["| KV cache | bytes/token | perplexity | vs fp16-kv | mean abs NLL delta (nats) | "
             "greedy identical | mean identical prefix |", "|---|---|---|---|---|---|---|"]
    for row, r in results.items():
        same = round(r["identical"] * r["prompts"])
        lines.append(f"| {row} | {r['kv_bytes_per_token']:.0f} | {r['ppl']:.4f} | "
                     f"{(r['ppl'] / ref - 1) * 100:+.2f}% | {r['mean_abs_nll_delta']:.4f} | "
                     f"{same}/{r['prompts']:.0f} | {r['mean_prefix']:.1f}/{MAX_NEW} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=0, help="use the first N tokens (0 = all)")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write fp8_kv.md and fp8_kv.json here")
    args = ap.parse_args()
    results = measure(args.model, args.tokens, args.chunk, args.threads)
    print(json.dumps(results, indent=2))
    print(table(results))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fp8_kv.json").write_text(json.dumps(results, indent=2) + "\n")
        r = results["fp8-kv"]
        (out / "fp8_kv.md").write_text(
            "# fp8 KV cache vs float16 KV (quality)\n\n"
            f"`{COMMAND}`\n\n"
            "SmolLM2-135M-Instruct (its Q4_1 GGUF, weights as stored), both rows on the torch "
            "path so only the KV cache differs; perplexity over tests/data/ppl_text.txt "
            f"({r['tokens']:.0f} tokens, prefill chunks of {args.chunk}: later chunks attend "
            "over the cached K/V); greedy agreement over the engine tests' prompt set, "
            f"{MAX_NEW} tokens each, against fp16-kv. The fp8 cache is e4m3 over per-tensor "
            "scales of 1.0 (tandem/engine/quant/kv_fp8.py): half the bytes of the float16 "
            "cache, in memory and on the KV push; int8-kv (int8 with an fp32 scale per head "
            "vector, tandem/engine/quant/kv_int8.py) for comparison.\n\n"
            f"{table(results)}\n\n"
            "Quality only (no timing), so the shared machine does not move these numbers; "
            "indicative for this model and text, not a claim about others.\n")


if __name__ == "__main__":
    main()
