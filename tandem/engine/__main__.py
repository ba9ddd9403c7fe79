"""``python -m tandem.engine``: generate offline with the local engine (no router, no workers)."""

from __future__ import annotations

import argparse
import sys
import time

from tandem.common.arg_parser import ArgParser
from tandem.engine.cli_args import add_engine_args, engine_config_from_args


def build_parser() -> argparse.ArgumentParser:
    """CLI flags mirror EngineConfig's fields."""
    p = ArgParser(prog="python -m tandem.engine", description=__doc__, config_file=True)
    add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--sample-seed", type=int, default=None, help="per-request sampling seed")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the prompts and print each completion with its throughput."""
    args = build_parser().parse_args(argv)
    from tandem.engine import LLM, SamplingParams

    llm = LLM.from_config(engine_config_from_args(args))
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
        seed=args.sample_seed,
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
