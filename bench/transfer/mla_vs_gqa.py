"""What a P/D handoff pushes per prompt token, and its TTFT: a model with multi-head latent
attention (DeepSeek's latent KV cache) against a GQA model of the same hidden size (issue 47;
results in docs/bench/mla.md).

    python -m bench.transfer.mla_vs_gqa --shapes-only          # published shapes, no run
    python -m bench.transfer.mla_vs_gqa [--hidden 4096] [--layers 2] [--prompt 512]
                                        [--rounds 5] [--dtype bfloat16] [--device auto]

``--shapes-only`` prints the bytes per token each layout pushes for published model shapes
(KvLayout.payload_bytes, the figure the transfer layer itself sends), no engine started.

Otherwise two random checkpoints of one hidden size, layer count and vocabulary, dense MLPs
(tandem/engine/testing/tiny.py): GQA (llama: heads of 128, a quarter of them KV heads: at
hidden 4096 Llama-3-8B's 8 KV heads) and MLA (deepseek_v3: DeepSeek's kv_lora_rank 512 + rope 64, q-LoRA). For each, a
prefill engine and a decode engine in this process, both on the torch path, and for every
round one prompt: prefilled on P (first token sampled there), its blocks pushed from P's cache
into blocks reserved on D by kv_transfer (Sender -> Receiver over TCP loopback: the production
transport, frames sealed), the first token committed on D, D's first decode step run.

    TTFT (handoff) = prefill on P + push (open .. Committed on D)     (the first token streams)
    to 2nd token   = TTFT + commit + D's first decode step

The push here starts after the prefill (the workers overlap it with the prefill, layer by
layer), so "push" is the whole transfer's cost. Medians over the rounds, both models' rounds
interleaved; the bytes pushed are counted by the receiver's stats, checked against the layout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tandem.kv_transfer import Committed, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.transport import TcpTransport

HEAD_DIM = 128
# DeepSeek-V2/V3's latent: kv_lora_rank 512 + qk_rope_head_dim 64 (576 values a token and layer)
MLA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}

# name -> (layers, kv heads, head dim, kv_lora_rank, rope dims): published shapes (config.json)
SHAPES = {
    "DeepSeek-V3 / R1 (hidden 7168)": (61, 1, 576, 512, 64),
    "GQA, hidden 7168, 8 KV heads x 128, 61 layers": (61, 8, 128, 0, 0),
    # its decompressed keys (192) and values (128) as a K/V cache: 128 heads x 2 x 160 values
    "DeepSeek-V3 decompressed (128 heads, K 192 + V 128)": (61, 128, 160, 0, 0),
    "DeepSeek-V2-Lite (hidden 2048, 27 layers)": (27, 1, 576, 512, 64),
    "Llama-3.1-8B (hidden 4096, 32 layers, 8 KV heads)": (32, 8, 128, 0, 0),
    "Qwen2.5-72B (hidden 8192, 80 layers, 8 KV heads)": (80, 8, 128, 0, 0),
}


def shape_bytes_per_token(layers: int, heads: int, head_dim: int, rank: int, dtype: str) -> int:
    """Bytes one prompt token adds to a handoff's payload, from kv_transfer's own layout."""
    layout = KvLayout("shape", dtype, dtype, 1, layers, heads, head_dim, kv_lora_rank=rank)
    return layout.payload_bytes(layers, 1)


def print_shapes(dtype: str) -> None:
    """The bytes-per-token table of published shapes (no engine, no timing)."""
    base = shape_bytes_per_token(*SHAPES["DeepSeek-V3 / R1 (hidden 7168)"][:3],
                                 SHAPES["DeepSeek-V3 / R1 (hidden 7168)"][3], dtype)
    print(f"| model ({dtype} cache) | KV bytes per token | / DeepSeek-V3's latent |")
    print("|---|---:|---:|")
    for name, (layers, heads, hd, rank, _rope) in SHAPES.items():
        n = shape_bytes_per_token(layers, heads, hd, rank, dtype)
        print(f"| {name} | {n:,} | {n / base:.2f} |")


@dataclass(slots=True)
class Round:
    """One handoff's timings (seconds) and bytes."""

    prefill_s: float
    push_s: float
    second_token_s: float
    bytes_pushed: int


class Pair:
    """A prefill and a decode engine over one checkpoint, and a transfer channel between."""

    def __init__(self, path: Path, args: argparse.Namespace) -> None:
        from tandem.engine import EngineConfig, LLMEngine
        from tandem.worker.convert import kv_layout

        def engine() -> LLMEngine:
            return LLMEngine(EngineConfig.from_kwargs(
                model=str(path), dtype=args.dtype, device=args.device, block_size=16,
                num_blocks=-(-args.prompt // 16) * 2 + 4, use_native_kernels=False,
                max_num_batched_tokens=max(args.prompt, 256)), progress=False)

        self.prefill, self.decode = engine(), engine()
        self.layout = kv_layout(self.prefill.remote.kv_cache_spec())
        secret = os.urandom(32)  # this run's own: nothing built in
        self.rx = Receiver(self.decode.remote.kv_cache, self.layout, ReceiverConfig(secret),
                           [TcpTransport(ReceiverConfig(secret).limits)])
        self.tx = Sender(self.prefill.remote.kv_cache, self.layout, SenderConfig(secret),
                         [TcpTransport(SenderConfig(secret).limits)])
        self.endpoint = None

    async def start(self) -> None:
        self.endpoint = await self.rx.start()

    async def close(self) -> None:
        await self.tx.close()
        await self.rx.close()

    async def handoff(self, prompt: list[int], rid: str) -> Round:
        """One prompt through P, the push, and D's first decode step."""
        from tandem.engine import SamplingParams

        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        two = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        before = self.rx.stats().bytes_received
        t0 = time.perf_counter()
        self.prefill.remote.prefill.add(prompt, one, request_id=rid)
        first = None
        while self.prefill.has_unfinished():
            for out in self.prefill.step():
                first = out.token_ids[0]
        assert first is not None
        t1 = time.perf_counter()
        src = self.prefill.remote.prefill.held_block_ids(rid)
        dst = self.decode.remote.decode.reserve(rid, prompt, two).fill_block_ids
        self.rx.reserve(rid, dst, lease_s=60)
        transfer = await self.tx.open(rid, self.endpoint, src, dst, time.monotonic() + 60)
        transfer.push(0, self.layout.num_layers)
        await transfer.commit(first, 0.0)
        event = await self.rx.events.get()
        assert isinstance(event, Committed) and event.transfer_id == rid, event
        t2 = time.perf_counter()
        self.prefill.remote.prefill.release(rid)
        self.rx.release(rid)
        self.decode.remote.decode.commit(rid, first)
        while self.decode.has_unfinished():
            self.decode.step()
        t3 = time.perf_counter()
        pushed = self.rx.stats().bytes_received - before
        expected = self.layout.payload_bytes(self.layout.num_layers, len(src))
        assert pushed == expected, (pushed, expected)
        return Round(t1 - t0, t2 - t1, t3 - t0, pushed)


def checkpoints(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The GQA and the MLA checkpoint of one hidden size (random, perturbed weights)."""
    from tandem.engine.testing import make_tiny_checkpoint

    heads = args.hidden // HEAD_DIM
    common = {"hidden_size": args.hidden, "num_layers": args.layers, "num_heads": heads,
              "vocab_size": 32000, "max_position_embeddings": max(4096, 2 * args.prompt)}
    return {
        "GQA": make_tiny_checkpoint(root / "gqa", "llama", num_kv_heads=max(1, heads // 4),
                                    **common),
        "MLA": make_tiny_checkpoint(root / "mla", "deepseek_v3", q_lora_rank=args.hidden // 2,
                                    **MLA, **common),
    }


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pairs = {name: Pair(path, args) for name, path in checkpoints(Path(tmp), args).items()}
        for p in pairs.values():
            await p.start()
        g = torch.Generator().manual_seed(0)
        rounds: dict[str, list[Round]] = {name: [] for name in pairs}
        try:
            for i in range(args.rounds + 1):  # round 0 warms up
                prompt = torch.randint(3, 32000, (args.prompt,), generator=g).tolist()
                for name, p in pairs.items():
                    r = await p.handoff(prompt, f"{name}-{i}")
                    if i:
                        rounds[name].append(r)
        finally:
            for p in pairs.values():
                await p.close()
    print(f"hidden {args.hidden}, {args.layers} layers, {args.prompt}-token prompts, "
          f"{args.dtype} on {args.device}, {args.rounds} rounds (medians)")
    print("| model | KV bytes per token | bytes pushed | prefill ms | push ms | "
          "TTFT (handoff) ms | to 2nd token ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med: dict[str, dict[str, float]] = {}
    for name, rs in rounds.items():
        m = {k: statistics.median(getattr(r, k) for r in rs)
             for k in ("prefill_s", "push_s", "second_token_s", "bytes_pushed")}
        med[name] = m
        print(f"| {name} | {m['bytes_pushed'] / args.prompt:,.0f} | {m['bytes_pushed']:,.0f} | "
              f"{m['prefill_s'] * 1e3:.1f} | {m['push_s'] * 1e3:.2f} | "
              f"{(m['prefill_s'] + m['push_s']) * 1e3:.1f} | {m['second_token_s'] * 1e3:.1f} |")
    g_, m_ = med["GQA"], med["MLA"]
    print(f"bytes per token GQA / MLA: {g_['bytes_pushed'] / m_['bytes_pushed']:.2f}x; "
          f"push time GQA / MLA: {g_['push_s'] / m_['push_s']:.2f}x")


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes-only", action="store_true",
                    help="print bytes per token of published shapes and exit (no run)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="auto", help="auto: cuda when there is one, else cpu")
    args = ap.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.shapes_only:
        print_shapes(args.dtype)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    cli()
