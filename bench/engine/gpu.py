"""GPU decode throughput of our engine vs transformers generate(), random weights, one run.

    python -m bench.engine.gpu [--configs smollm2,llama1b] [--batch 1,32,128]

Runs only on CUDA (the lent GPU machine has no model files, so models are built from a config
with random weights). For each config and batch size it prints output tokens/s for: our engine
with CUDA graphs, our engine eager, and transformers generate() (static batch), plus ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIGS = {
    # SmolLM2-135M's shape
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
    # Llama-3.2-1B's shape
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


def _checkpoint(name: str, root: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**CONFIGS[name], max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, rope_theta=100000.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    path = root / name
    model.save_pretrained(path)
    return path


def _ours(path: Path, batch: int, prompt: int, out: int, graphs: bool) -> float:
    from tandem.engine import LLM, SamplingParams

    llm = LLM(model=str(path), device="cuda", dtype="bfloat16", max_num_seqs=batch,
              use_cuda_graphs=graphs, kv_cache_memory_gb=8.0, progress=False)
    g = torch.Generator().manual_seed(0)
    vocab = llm.engine.arch.vocab_size
    prompts = [torch.randint(3, vocab, (prompt,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del llm
    torch.cuda.empty_cache()
    return batch * out / dt


@torch.inference_mode()
def _hf(path: Path, batch: int, prompt: int, out: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), device="cuda")
    model.generate(ids[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=out, min_new_tokens=out, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del model
    torch.cuda.empty_cache()
    return batch * out / dt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    p.add_argument("--configs", default="smollm2,llama1b")
    p.add_argument("--batch", default="1,32,128")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--out-tokens", type=int, default=128)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.engine.gpu needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            path = _checkpoint(name, Path(tmp))
            for b in (int(x) for x in args.batch.split(",")):
                g = _ours(path, b, args.prompt, args.out_tokens, graphs=True)
                e = _ours(path, b, args.prompt, args.out_tokens, graphs=False)
                h = _hf(path, b, args.prompt, args.out_tokens)
                row = dict(config=name, batch=b, graphs_tok_s=g, eager_tok_s=e, hf_tok_s=h,
                           graphs_vs_hf=g / h, graphs_vs_eager=g / e)
                rows.append(row)
                print(f"{name:8s} batch {b:4d}: graphs {g:9.1f} tok/s  eager {e:9.1f}  "
                      f"hf {h:9.1f}  graphs/hf {g / h:5.2f}x  graphs/eager {g / e:5.2f}x",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
