"""Quality of quantization, measured: perplexity on a fixed text and greedy agreement.

    .venv/bin/python -m bench.quality.perplexity                       # all rows, ~3-5 min on 2 cores
    .venv/bin/python -m bench.quality.perplexity --tokens 512 --rows fp32,int4-q4_1

Rows (SmolLM2-135M-Instruct from its Q4_1 GGUF):
  fp32        the GGUF dequantized to fp32 (the reference for int4-q4_1)
  bf16        the same weights in bf16
  int8        int8 per output channel (from the fp32 weights), fp32 activations
  int4-q4_1   int4 taken straight from the GGUF's Q4_1 blocks (lm_head int8)
  int4-requant  int4 by min/max re-quantization of the fp32 weights (a second rounding)
  int8-kv     fp32 weights, int8 KV cache;  bf16+int8-kv: bf16 weights, int8 KV cache

Perplexity runs the text (tests/data/ppl_text.txt) as one sequence in prefill chunks of
``--chunk`` tokens over a private cache laid out like the engine's (same dtype, int8 scales
included), with the engine's attention backend (so int8 KV is in the measurement). Chunks of
fewer rows than the quantized layers' dequant threshold take the decode kernels (bf16
activations); larger chunks measure the quantized weights exactly in fp32. ``fused=True`` runs
every chunk through the runner's fused native forward instead (tandem/engine/native: int16
activations), the path CPU decode steps take.

    perplexity = exp(mean over t of -log p(x[t+1] | x[..t]))

Greedy agreement: the prompt set of tests/unit/engine/test_smollm2.py, 24 greedy tokens each,
against the bf16 row: the share of prompts whose tokens are all identical and the mean length
of the identical prefix. ``token_nlls`` and ``perplexity`` are also what the quantization tests
measure (tests/unit/engine/test_quant_model.py, test_kv_int8.py).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tandem.engine import SamplingParams
from tandem.engine.attention import AttentionMetadata
from tandem.engine.config import EngineConfig
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.loader import resolve_model
from tandem.engine.model_runner import ModelRunner

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ppl_text.txt"
MAX_NEW = 24

F32_KV = {"kv_cache_dtype": "float32"}  # weight rows: the KV cache as the reference's
ROWS: dict[str, dict[str, str]] = {
    "fp32": {"dtype": "float32", "quantization": "none", **F32_KV},
    "bf16": {"dtype": "bfloat16", "quantization": "none"},
    # the default: the GGUF's Q4_1 + Q8_0 blocks as stored, the float16 KV cache
    "auto": {"dtype": "float32"},
    "int8": {"dtype": "float32", "quantization": "int8", **F32_KV},
    "int4-q4_1": {"dtype": "float32", "quantization": "int4", **F32_KV},
    "int4-requant": {"dtype": "float32", "quantization": "int4", "dequantized": "1", **F32_KV},
    "fp16-kv": {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "float16"},
    "int8-kv": {"dtype": "float32", "quantization": "none", "kv_cache_dtype": "int8"},
    "bf16+int8-kv": {"dtype": "bfloat16", "quantization": "none", "kv_cache_dtype": "int8"},
}


@torch.inference_mode()
def token_nlls(
    runner: ModelRunner, token_ids: Sequence[int], chunk: int = 256, fused: bool = False
) -> torch.Tensor:
    """Negative log-likelihood of each token after the first: ``[len(token_ids) - 1]`` fp32."""
    if len(token_ids) < 2:
        raise ValueError("need at least two tokens")
    if fused and runner.fused is None:
        raise ValueError("this runner has no fused native forward")
    model, bs, dev = runner.model, runner.block_size, runner.device
    n = len(token_ids)
    num_blocks = -(-n // bs)
    shape = list(runner.kv_cache.shape)
    shape[2] = num_blocks
    kv = torch.zeros(shape, dtype=runner.kv_cache.dtype, device=dev)  # private cache
    table = torch.arange(num_blocks, dtype=torch.int32, device=dev)[None, :]
    ids = torch.tensor(list(token_ids), dtype=torch.int64, device=dev)
    nlls: list[torch.Tensor] = []
    for start in range(0, n - 1, chunk):
        end = min(n - 1, start + chunk)  # rows start..end-1 predict tokens start+1..end
        q = end - start
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, q], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
            block_tables=table,
            slot_mapping=torch.arange(start, end, dtype=torch.int64, device=dev),
            query_lens_cpu=[q],
            seq_lens_cpu=[end],
            num_decodes=1 if q == 1 else 0,
            block_size=bs,
        )
        positions = torch.arange(start, end, dtype=torch.int64, device=dev)
        if fused:
            logits = runner.fused(token_ids[start:end], range(start, end), [0] * q,
                                  [range(num_blocks)], kv, range(q))
        else:
            hidden = model(ids[start:end], positions, kv, meta, runner.backend)
            logits = model.compute_logits(hidden)  # [q, V] fp32
        nlls.append(torch.nn.functional.cross_entropy(logits, ids[start + 1 : end + 1],
                                                      reduction="none").cpu())
    return torch.cat(nlls)


def perplexity(
    runner: ModelRunner, token_ids: Sequence[int], chunk: int = 256, fused: bool = False
) -> float:
    """``exp`` of the mean token NLL (see ``token_nlls``)."""
    return math.exp(token_nlls(runner, token_ids, chunk, fused).mean().item())


def make_engine(row: str, model: str, threads: int) -> LLMEngine:
    """An engine for one row (``int4-requant`` loads the converted directory, so the int4
    weights come from the fp32 ones instead of the GGUF's blocks)."""
    opts = dict(ROWS[row])
    spec = str(resolve_model(model)) if opts.pop("dequantized", None) else model
    config = EngineConfig.from_kwargs(model=spec, num_blocks=1024, num_threads=threads,
                                      max_num_batched_tokens=512, **opts)
    return LLMEngine(config, progress=False)


def greedy(engine: LLMEngine, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                got[out.request_id] = list(out.token_ids)
    return [got[i] for i in ids]


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Share of sequences identical to ``ref`` and the mean identical-prefix length."""
    prefix = []
    for a, b in zip(ref, other, strict=True):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix.append(n)
    return {"identical": sum(p == MAX_NEW for p in prefix) / len(prefix),
            "mean_prefix": sum(prefix) / len(prefix)}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--tokens", type=int, default=0, help="use the first N tokens (0 = all)")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--out", default=None, help="write perplexity.json into this directory")
    args = ap.parse_args()
    torch.manual_seed(0)
    from tests.unit.engine.test_smollm2 import _prompts  # the engine tests' prompt set

    rows = args.rows.split(",")
    results: dict[str, dict[str, float]] = {}
    ref_tokens: list[list[int]] | None = None
    order = rows if args.no_greedy else ["bf16"] + [r for r in rows if r != "bf16"]
    for row in order:  # bf16 first: the greedy reference
        t0 = time.perf_counter()
        engine = make_engine(row, args.model, args.threads)
        tok = engine.tokenizer
        ids = tok.encode(TEXT.read_text())
        ids = ids[: args.tokens] if args.tokens else ids
        res: dict[str, float] = {"tokens": len(ids)}
        res["ppl"] = perplexity(engine.runner, ids, args.chunk)
        if not args.no_greedy:
            out = greedy(engine, _prompts(tok))
            if row == "bf16":
                ref_tokens = out
            assert ref_tokens is not None
            res.update(agreement(ref_tokens, out))
        res["seconds"] = time.perf_counter() - t0
        if row in rows:
            results[row] = res
        print(row, json.dumps({k: round(v, 4) for k, v in res.items()}), flush=True)
    print()
    print("| row | perplexity | vs fp32 | vs bf16 | greedy identical | mean identical prefix |")
    print("|---|---|---|---|---|---|")
    for row, r in results.items():
        rel = {b: f"{(r['ppl'] / results[b]['ppl'] - 1) * 100:+.2f}%" if b in results else "-"
               for b in ("fp32", "bf16")}
        g = (f"{r['identical'] * 100:.0f}% | {r['mean_prefix']:.1f}/{MAX_NEW}"
             if "identical" in r else "- | -")
        print(f"| {row} | {r['ppl']:.4f} | {rel['fp32']} | {rel['bf16']} | {g} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "perplexity.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
