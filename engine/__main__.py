"""``python -m engine``: generate offline with the local engine (no router, no workers)."""

from __future__ import annotations

import argparse
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    """CLI flags mirror EngineConfig's fields."""
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    p.add_argument("--model", default="smollm2", help="alias, HF directory or .gguf file")
    p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the prompts and print each completion with its throughput."""
    args = build_parser().parse_args(argv)
    from engine import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        num_threads=args.threads,
        attention_backend=args.attention_backend,
    )
    prompts = args.prompt
    if args.chat:
        if llm.tokenizer is None:
            print("this model has no tokenizer/chat template", file=sys.stderr)
            return 2
        prompts = [
            llm.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    for prompt, out in zip(args.prompt, outs, strict=False):
        print(f"--- {prompt!r} ({out.finish_reason})\n{out.text}")
    n = sum(len(o.token_ids) for o in outs)
    print(f"--- {n} tokens in {dt:.2f} s ({n / dt:.1f} tok/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
