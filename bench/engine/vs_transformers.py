"""Engine throughput and latency against transformers ``generate()``, side by side, one run.

    python -m bench.engine.vs_transformers [--dtypes float32,bfloat16] [--repeats 3] [--quick] [--out docs/bench]

Workloads (each run on our engine and on transformers, same weights, dtype and threads):
  batch      64 requests, 128-token prompts, 128 output tokens, max batch 32
             (transformers: two static batches of 32)
  mixed      prompts of 16..1,024 tokens, outputs of 16..256 (seeded); our engine batches
             continuously (max 32), transformers runs static batches of 32 with left padding,
             each batch running to its longest output (only requested tokens are counted)
  single     batch 1, 128 output tokens: ms per token, next to the memory-bandwidth floor
             (bytes of our weights read per step / read bandwidth measured in this run)
  prefill    one 512-token prompt: prompt tokens per second
  lookup     single stream on edit/quote-a-document prompts (bench/engine/lookup.py): plain,
             n-gram and draft speculation, beside transformers generate() with and without
             prompt_lookup_num_tokens; outputs compared token for token
  quant      single stream by weight format: fp32, bf16, int8, int4 (bench/engine/quant.py;
             our engine only, one run for all --dtypes)
Every number is the median of ``--repeats`` runs (``--heavy-repeats`` for batch and mixed,
which take minutes each in bf16 on a 2-core CPU); ratios are ours / transformers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.engine.workloads import (
    Workload,
    batch_workload,
    hf_static_generate,
    measure_read_bandwidth,
    mixed_workload,
    single_workload,
    weight_bytes,
)

ALL_WORKLOADS = "batch,mixed,single,prefill,lookup,quant"


def _median(fn: Callable[..., float], repeats: int, *args: object) -> float:
    return statistics.median(fn(*args) for _ in range(repeats))


def _ours(llm, wl: Workload) -> float:
    """Seconds for our engine to finish the whole workload."""
    from tandem.engine import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in wl.outputs]
    llm.engine.kv.pool.reset_prefix_cache()  # repeats must not reuse the last run's KV
    t0 = time.perf_counter()
    outs = llm.generate(wl.prompts, params)
    dt = time.perf_counter() - t0
    assert sum(len(o.token_ids) for o in outs) == sum(wl.outputs)
    return dt


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    from tandem.engine import LLM

    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict = {
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "heavy_repeats": args.heavy_repeats,
        "mixed_requests": args.mixed_requests,
        "dtypes": {},
    }
    bw = measure_read_bandwidth()
    results["read_bandwidth_gbs"] = bw / 1e9
    print(f"threads={torch.get_num_threads()}  measured read bandwidth {bw / 1e9:.1f} GB/s")
    per_dtype = {"batch", "mixed", "single", "prefill", "lookup"} & set(args.workloads.split(","))
    for dtype in args.dtypes.split(",") if per_dtype else []:
        print(f"\n== {dtype} ==", flush=True)
        llm = LLM(model=args.model, dtype=dtype, max_num_seqs=32, max_num_batched_tokens=2048,
                  progress=False)
        path = llm.engine.model_path
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        vocab = llm.engine.arch.vocab_size
        scale = 4 if args.quick else 1
        rows = {}
        workloads = (
            ("batch", batch_workload(vocab, n=64 // scale, out=128 // scale)),
            ("mixed", mixed_workload(vocab, n=args.mixed_requests // scale, quick=args.quick)),
            ("single", single_workload(vocab, out=128 // scale)),
            ("prefill", single_workload(vocab, prompt=512, out=1)),
        )
        for name, wl in workloads:
            if name not in args.workloads.split(","):
                continue
            print(f"  {name}: {wl.describe()}", flush=True)
            reps = args.repeats if name in ("single", "prefill") else args.heavy_repeats
            ours = _median(_ours, reps, llm, wl)
            theirs = _median(hf_static_generate, reps, hf, wl, 32)
            if name == "prefill":
                row = {"ours_tok_s": wl.prompt_tokens / ours, "hf_tok_s": wl.prompt_tokens / theirs}
            elif name == "single":
                n = sum(wl.outputs)
                row = {"ours_ms_per_tok": 1e3 * ours / n, "hf_ms_per_tok": 1e3 * theirs / n}
            else:
                n = sum(wl.outputs)
                row = {"ours_tok_s": n / ours, "hf_tok_s": n / theirs}
            row["ratio"] = theirs / ours
            rows[name] = row
            print("   " + "  ".join(f"{k}={v:.2f}" for k, v in row.items()), flush=True)
        if "single" in rows:
            wbytes = weight_bytes(llm.engine.runner.model)
            floor_ms = 1e3 * wbytes / bw
            rows["single"]["floor_ms_per_tok"] = floor_ms
            rows["single"]["x_floor"] = rows["single"]["ours_ms_per_tok"] / floor_ms
            print(f"   weights {wbytes / 1e6:.0f} MB -> floor {floor_ms:.1f} ms/token; ours is "
                  f"{rows['single']['x_floor']:.2f}x the floor")
        if "lookup" in args.workloads.split(","):
            from bench.engine.lookup import run_lookup

            print("  lookup: 4 edit/quote prompts, batch 1", flush=True)
            rows["lookup"] = run_lookup(
                args.model, dtype, hf, 32 if args.quick else args.lookup_max_tokens,
                args.num_speculative_tokens, args.ngram_max, args.ngram_min, args.draft_layers,
                args.draft_tokens, args.repeats,
            )
            print("   " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                    for k, v in rows["lookup"].items()), flush=True)
        results["dtypes"][dtype] = rows
        del llm, hf
    if "quant" in args.workloads.split(","):
        from bench.engine.quant import ROWS, run_quant

        print("\n== quant: single stream by weight format ==", flush=True)
        results["quant"] = run_quant(args.model, list(ROWS), args.repeats,
                                     32 if args.quick else 128, bw)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                allow_abbrev=False, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3, help="runs of single/prefill (median)")
    p.add_argument("--heavy-repeats", type=int, default=3, help="runs of batch/mixed (median)")
    p.add_argument("--mixed-requests", type=int, default=64)
    p.add_argument("--workloads", default=ALL_WORKLOADS)
    p.add_argument("--lookup-max-tokens", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=6, help="lookup: n-gram k")
    p.add_argument("--ngram-max", type=int, default=4, help="lookup: longest n-gram")
    p.add_argument("--ngram-min", type=int, default=1, help="lookup: shortest n-gram")
    p.add_argument("--draft-layers", type=int, default=6, help="lookup: draft = first N layers")
    p.add_argument("--draft-tokens", type=int, default=3, help="lookup: draft k")
    p.add_argument("--quick", action="store_true", help="quarter-size workloads (smoke run)")
    p.add_argument("--out", type=Path, default=None, help="write engine.json and engine.png here")
    args = p.parse_args(argv)
    results = run(args)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        # A partial run gets its own file: it must not replace the full results.
        stem = "engine" if args.workloads == ALL_WORKLOADS else "engine-" + "-".join(
            args.workloads.split(","))
        (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out / f'{stem}.json'}")
        from bench.engine.plot import plot

        if {"batch", "mixed", "single"} <= set(args.workloads.split(",")):
            plot(results, args.out / f"{stem}.png")
            print(f"wrote {args.out / f'{stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
