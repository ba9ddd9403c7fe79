"""The ``quant`` workload of bench/engine/vs_transformers.py: single-stream decode speed by weight format.

    python -m bench.engine.vs_transformers --dtypes float32 --workloads quant [--repeats 3]

One engine per row, same prompt (16 tokens) and 128 greedy output tokens at batch 1:
  fp32, bf16             dense weights (the baselines)
  int8, int4             fp32 activations, weight-only int8 / int4 (int4 straight from the
                         GGUF's Q4_1 blocks when the model is a Q4_1 GGUF; lm_head int8),
                         decode steps through the fused native forward (tandem/engine/native)
  int8-torch, int4-torch the same weights on torch ops (--no-native-kernels): the baseline
  int4-bf16              int4 weights with bf16 activations everywhere (torch ops)
  int4-kv8, -kv8-torch   int4 with the int8 KV cache (per-head-vector scales), native / torch
Reports tokens/s (decode only: timed from the first token on), ms per token, the bytes of
weights a decode step reads, and that read's floor at the bandwidth measured in the run.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.engine.workloads import single_workload
from tandem.engine.quant import Int4Linear, Int8Linear

ROWS: dict[str, dict[str, str]] = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "int8": {"dtype": "float32", "quantization": "int8"},
    "int8-torch": {"dtype": "float32", "quantization": "int8", "use_native_kernels": False},
    "int4": {"dtype": "float32", "quantization": "int4"},
    "int4-torch": {"dtype": "float32", "quantization": "int4", "use_native_kernels": False},
    "int4-bf16": {"dtype": "bfloat16", "quantization": "int4"},
    "int4-kv8": {"dtype": "float32", "quantization": "int4", "kv_cache_dtype": "int8"},
    "int4-kv8-torch": {"dtype": "float32", "quantization": "int4", "kv_cache_dtype": "int8",
                       "use_native_kernels": False},
}


def decode_read_bytes(model: torch.nn.Module, fused: object = None) -> int:
    """Bytes one decode step reads from weights: what each linear's decode kernel reads, plus
    norms (embedding rows are one row per token: left out; a tied lm_head counted once)."""
    if fused is not None:  # the fused native forward reads its own repacked copies
        return fused.weight_bytes()  # type: ignore[attr-defined]
    total = 0
    for m in model.modules():
        if isinstance(m, Int4Linear):
            total += _nbytes(m.cpu_pack if m.cpu_pack is not None else m.qweight)
            total += _nbytes(m.cpu_scale_zero) if m.cpu_scale_zero is not None else 0
        elif isinstance(m, Int8Linear):
            total += _nbytes(m.qweight) + _nbytes(m.scale_bf16)
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if "embed_tokens" in name and not _tied_head(model):
            continue
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += _nbytes(p)
    return total


def _tied_head(model: torch.nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    return head is not None and isinstance(getattr(head, "weight", None), torch.nn.Parameter) \
        and head.weight is model.embed_tokens.weight  # type: ignore[union-attr]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _decode_seconds(llm, prompt: list[int], out: int) -> float:
    """Seconds from the first output token to the last (prefill excluded)."""
    from tandem.engine import SamplingParams

    engine = llm.engine
    engine.kv.pool.reset_prefix_cache()
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=out,
                                                    ignore_eos=True))
    n, t0 = 0, 0.0
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid:
                if n == 0:
                    t0 = time.perf_counter()
                n += len(o.new_token_ids)
    assert n == out
    return time.perf_counter() - t0


def run_quant(model: str, rows: list[str], repeats: int, out: int, bandwidth: float) -> dict:
    """One row per weight format; see the module docstring."""
    from tandem.engine import LLM

    results: dict[str, dict[str, float]] = {}
    for row in rows:
        llm = LLM(model=model, max_num_seqs=1, progress=False, num_blocks=64, **ROWS[row])
        wl = single_workload(llm.engine.arch.vocab_size, out=out)
        _decode_seconds(llm, wl.prompts[0], 8)  # warm-up
        dt = statistics.median(_decode_seconds(llm, wl.prompts[0], out) for _ in range(repeats))
        steps = out - 1  # the first token came from the prefill step
        read = decode_read_bytes(llm.engine.runner.model, llm.engine.runner.fused)
        res = {"tok_s": steps / dt, "ms_per_tok": 1e3 * dt / steps, "read_mb": read / 1e6,
               "floor_ms": 1e3 * read / bandwidth}
        results[row] = res
        print(f"   {row:10s} " + "  ".join(f"{k}={v:.2f}" for k, v in res.items()), flush=True)
        del llm
    return results
