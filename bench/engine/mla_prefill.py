"""Prefill and decode time of a DeepSeek-style (MLA) model on the native CPU forward against the
torch forward, the same checkpoint on both.

    python -m bench.engine.mla_prefill [--prompts 128,512,2048] [--layers 4] [--repeats 3]
                                       [--threads 2] [--decode-steps 16]

The checkpoint is random (tandem/engine/testing/tiny.py), written to a temporary folder, with
DeepSeek-V2-Lite's attention shape (16 heads, ``kv_lora_rank`` 512, rope 64, nope 128, value
128, hidden 2048) and a dense MLP, ``--layers`` deep, so the figures are the attention's.
Both paths keep the latent cache and decompress each layer's K/V for a long prefill chunk
through ``kv_b_proj`` (the native forward where its count of products says so:
tandem/engine/native/mla_decompress.h), and decode in latent space (the queries absorbed into
``kv_b_proj``'s key half, per head). Each
prompt length is timed as a whole prefill (the time to the first token of a fresh prompt, the
prefix cache emptied first), then ``--decode-steps`` greedy tokens after it (ms a token); every figure the
fastest of ``--repeats`` runs, the two paths taking turns. Prints ms per prefill, native /
torch, and the decode rates beside them.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import torch

from bench.vs_llama_cpp.ours import stream
from tandem.engine import LLM
from tandem.engine.testing import make_tiny_checkpoint

SHAPE = dict(hidden_size=2048, num_heads=16, vocab_size=8192, kv_lora_rank=512,
             qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)


def _checkpoint(root: Path, layers: int, max_len: int) -> Path:
    return make_tiny_checkpoint(root / "mla", arch="deepseek_v2", num_layers=layers,
                                max_position_embeddings=max_len, intermediate_size=4096,
                                **SHAPE)


def _time(llm: LLM, length: int, out: int, seed: int) -> tuple[float, float]:
    """(seconds to the first token, seconds a token after it) of one fresh prompt."""
    rng = random.Random(seed)
    s = stream(llm, [rng.randrange(3, SHAPE["vocab_size"]) for _ in range(length)], out)
    return s.ttft_s, s.ms_per_token / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")],
                   default=[128, 512, 2048])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-steps", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = _checkpoint(Path(tmp), a.layers, 2 * max(a.prompts) + 64)
        llms = {path: LLM(str(ckpt), progress=False, enable_prefix_caching=False,
                          kv_cache_memory_gb=0.5, use_native_kernels=path == "native")
                for path in ("native", "torch")}
        print(f"DeepSeek-V2-Lite attention shape, {a.layers} layers, {a.threads} threads; "
              f"fastest of {a.repeats}")
        print(f"{'prompt':>7} {'native ms':>10} {'torch ms':>10} {'native/torch':>13} "
              f"{'decode native':>14} {'decode torch':>13}")
        for length in a.prompts:
            pre = {k: float("inf") for k in llms}
            dec = {k: float("inf") for k in llms}
            for llm in llms.values():  # warm-up at this length
                _time(llm, length, 2, seed=0)
            for r in range(a.repeats):
                for path, llm in llms.items():
                    first, per_token = _time(llm, length, 1 + a.decode_steps, seed=r + 1)
                    pre[path] = min(pre[path], first)
                    dec[path] = min(dec[path], per_token)
            print(f"{length:7d} {1e3 * pre['native']:10.1f} {1e3 * pre['torch']:10.1f} "
                  f"{pre['native'] / pre['torch']:12.2f}x {1e3 * dec['native']:11.2f} ms "
                  f"{1e3 * dec['torch']:10.2f} ms", flush=True)


if __name__ == "__main__":
    main()
