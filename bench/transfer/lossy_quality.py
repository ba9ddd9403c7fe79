"""What a lossy KV codec costs in quality, through the real P/D handoff (docs/kv_transfer.md).

    python -m bench.transfer.lossy_quality [--models smollm2,tiny] [--max-new 32] [--out DIR]

Two engines in this process, a prefill engine P and a decode engine D, with kv_transfer's real
``Sender`` (on P's cache) and ``Receiver`` (on D's) over TCP loopback, one sender per codec
(``raw``, ``int8``, and ``zstd`` when installed), each negotiating its codec at HELLO:

* **greedy agreement**: each prompt (chat and completion prompts on SmolLM2; random token
  prompts on the tiny random model) is prefilled on P, its blocks pushed into D's reservation
  under the codec, committed with P's first token, and decoded greedily on D for
  ``--max-new`` tokens. Against the ``raw`` handoff (bit-exact KV): the share of generated
  tokens equal at the same position, of sequences wholly equal, and the mean equal prefix.
* **perplexity**: windows of a fixed text (tests/data/ppl_text.txt; random tokens on the tiny
  model): the first ``--context`` tokens are prefilled into a private cache, pushed through
  the transfer under the codec into a second cache, and the next ``--continuation`` tokens are
  scored over the landed cache. The perplexity of those continuation tokens against raw's.
* **bytes**: the payload bytes each codec puts on the wire per raw byte, over the perplexity
  windows' contexts (full blocks), layer by layer as a push sends them.

Prints one table; ``--out`` writes lossy_quality.json there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tandem.engine import EngineConfig, LLMEngine, SamplingParams
from tandem.engine.attention import AttentionMetadata
from tandem.kv_transfer import (
    Committed,
    KvLayout,
    Receiver,
    ReceiverConfig,
    Sender,
    SenderConfig,
)
from tandem.kv_transfer.blocks import KvBlocks, SendSpan
from tandem.kv_transfer.codecs import available, codec
from tandem.kv_transfer.transport import TcpTransport
from tandem.worker.convert import kv_layout

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ppl_text.txt"
SECRET = os.urandom(32)  # this run's sender and receiver only
CHAT = [
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of copper.",
    "What is the difference between a list and a tuple in Python?",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "How do vaccines train the immune system?",
    "Suggest a name for a grey cat and say why.",
]
COMPLETION = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "The three laws of thermodynamics state that",
    "import numpy as np\n\ndef softmax(x):",
    "In 1969, the Apollo 11 mission",
    "The best way to learn a new language is",
    "Photosynthesis converts",
]


class Handoff:
    """P -> D over kv_transfer, one sender per codec, one receiver allowing them all."""

    def __init__(self, p: LLMEngine, d: LLMEngine, codecs: Sequence[str]) -> None:
        self.p, self.d = p, d
        self.layout = kv_layout(p.remote.kv_cache_spec())
        self.codecs = list(codecs)
        self.rx: Receiver | None = None
        self.tx: dict[str, Sender] = {}
        self.n = 0

    async def start(self) -> None:
        lay = self.layout
        self.rx = Receiver(self.d.remote.kv_cache, lay,
                           ReceiverConfig(SECRET, enable_shm=False,
                                          codecs=tuple(c for c in self.codecs if c != "raw")))
        self.endpoint = await self.rx.start()
        for name in self.codecs:
            cfg = SenderConfig(SECRET, codec=name, max_connections_per_endpoint=1)
            self.tx[name] = Sender(self.p.remote.kv_cache, lay, cfg, [TcpTransport(cfg.limits)])

    async def close(self) -> None:
        for tx in self.tx.values():
            await tx.close()
        if self.rx is not None:
            await self.rx.close()

    async def generate(self, prompt: list[int], name: str, max_new: int) -> list[int]:
        """Prefill on P, push under codec ``name``, decode on D: the generated tokens."""
        assert self.rx is not None
        self.n += 1
        rid = f"q{self.n}"
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        self.p.remote.prefill.add(prompt, one, request_id=rid)
        first = -1
        while self.p.has_unfinished():
            for out in self.p.step():
                if out.request_id == rid and out.token_ids:
                    first = out.token_ids[0]
        src = self.p.remote.prefill.held_block_ids(rid)
        greedy = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
        dst = list(self.d.remote.decode.reserve(rid, prompt, greedy).fill_block_ids)
        src = src[len(src) - len(dst):]  # D's prefix cache may hold the start already
        self.rx.reserve(rid, dst, lease_s=60)
        await self.tx[name].send(rid, self.endpoint, src, dst, first_token=first, logprob=0.0,
                                 deadline=time.monotonic() + 60)
        event = await self.rx.events.get()
        if not isinstance(event, Committed):
            raise RuntimeError(f"handoff failed: {event}")
        self.p.remote.prefill.release(rid)
        out = self.d.remote.decode.commit(rid, first)
        tokens = list(out.new_token_ids) if out is not None else [first]
        while self.d.has_unfinished():
            for o in self.d.step():
                if o.request_id == rid:
                    tokens += o.new_token_ids
        return tokens


@torch.inference_mode()
def _forward(runner: Any, kv: torch.Tensor, ids: list[int], start: int) -> torch.Tensor:
    """Logits of tokens ``ids`` at positions ``start..``, attending to ``kv`` (whose blocks
    0.. hold positions ``0..start-1``), writing their KV after them."""
    bs, dev = runner.block_size, runner.device
    end = start + len(ids)
    nblocks = int(kv.shape[2])
    q = len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, q], dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
        block_tables=torch.arange(nblocks, dtype=torch.int32, device=dev)[None, :],
        slot_mapping=torch.arange(start, end, dtype=torch.int64, device=dev),
        query_lens_cpu=[q], seq_lens_cpu=[end], num_decodes=1 if q == 1 else 0,
        block_size=bs)
    positions = torch.arange(start, end, dtype=torch.int64, device=dev)
    hidden = runner.model(torch.tensor(ids, dtype=torch.int64, device=dev), positions, kv, meta,
                          runner.backend)
    return runner.model.compute_logits(hidden)


async def continuation_nll(runner: Any, layout: KvLayout, tokens: list[int], context: int,
                           names: Sequence[str], rx: Receiver, endpoint: Any,
                           tag: str) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
    """Sum of NLLs of ``tokens[context:]`` after ``tokens[:context]``'s KV went through the
    transfer under each codec (the prompt's KV as the decode side would hold it), and each
    codec's (wire, raw) payload bytes for that context, layer by layer as a push sends it."""
    bs = runner.block_size
    nblocks = -(-len(tokens) // bs)
    shape = list(runner.kv_cache.shape)
    shape[2] = nblocks
    src = torch.zeros(shape, dtype=runner.kv_cache.dtype)
    _forward(runner, src, tokens[:context], 0)  # the prefill writes the context's KV
    ctx_blocks = list(range(-(-context // bs)))
    out: dict[str, float] = {}
    sizes = {n: wire_bytes(n, layout, src, ctx_blocks) for n in names}
    for name in names:
        dst = rx.blocks.kv
        dst.zero_()
        tid = f"{tag}-{name}"
        rx.reserve(tid, ctx_blocks, lease_s=60)
        cfg = SenderConfig(SECRET, codec=name)
        tx = Sender(src, layout, cfg, [TcpTransport(cfg.limits)])
        try:
            await tx.send(tid, endpoint, ctx_blocks, ctx_blocks, first_token=0, logprob=0.0,
                          deadline=time.monotonic() + 60)
        finally:
            await tx.close()
        event = await rx.events.get()
        if not isinstance(event, Committed):
            raise RuntimeError(f"transfer failed: {event}")
        logits = _forward(runner, dst, tokens[context:-1], context)
        target = torch.tensor(tokens[context + 1:], dtype=torch.int64)
        nll = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")
        out[name] = float(nll)
    return out, sizes


def wire_bytes(name: str, layout: KvLayout, kv: torch.Tensor,
               ids: list[int]) -> tuple[int, int]:
    """(wire, raw) payload bytes of codec ``name`` over blocks ``ids``, layer by layer."""
    c = codec(name)
    blocks = KvBlocks(kv, layout)
    raw = wire = 0
    for layer in range(layout.num_layers):
        span = SendSpan(blocks, layer, layer + 1, ids)
        payload = span.gather_all()
        enc = c.encode(payload, span.shape, layout)
        raw += payload.nbytes
        wire += payload.nbytes if enc is None else enc.nbytes
    return wire, raw


def engines(model: str, threads: int) -> tuple[LLMEngine, LLMEngine, str]:
    """Prefill and decode engines for ``model``: "smollm2" or "tiny" (a random llama)."""
    label = model
    if model == "tiny":
        from tandem.engine.testing.tiny import make_tiny_checkpoint

        path = make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="lossy-tiny-")), arch="llama",
                                    num_kv_heads=2, num_layers=4, hidden_size=128,
                                    num_heads=4, vocab_size=512)
        model, label = str(path), "tiny (random llama, 4 layers, 2 kv heads x 32)"
    make = lambda: LLMEngine(EngineConfig.from_kwargs(  # noqa: E731
        model=model, num_blocks=512, num_threads=threads, block_size=16), progress=False)
    return make(), make(), label


def prompts_for(engine: LLMEngine, model: str, n_random: int) -> list[tuple[str, list[int]]]:
    """(kind, token ids) of the prompt set: chat + completion, or random tokens (tiny)."""
    tok = engine.tokenizer
    if model == "tiny" or tok is None:
        rng = random.Random(0)
        return [("random", [rng.randrange(3, 500) for _ in range(rng.randrange(20, 300))])
                for _ in range(n_random)]
    out = [("chat", tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)))
           for p in CHAT]
    return out + [("completion", tok.encode(p)) for p in COMPLETION]


def ppl_windows(engine: LLMEngine, model: str, n: int, length: int) -> list[list[int]]:
    """``n`` token windows of ``length``: the fixed text's, or random tokens (tiny)."""
    tok = engine.tokenizer
    if model == "tiny" or tok is None:
        rng = random.Random(1)
        return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]
    ids = tok.encode(TEXT.read_text(encoding="utf-8"))
    step = max(1, (len(ids) - length) // max(1, n - 1))
    return [ids[i * step:i * step + length] for i in range(n) if i * step + length <= len(ids)]


async def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    names = ["raw", "int8"] + (["zstd"] if available("zstd") else [])
    p, d, label = engines(model, args.threads)
    hand = Handoff(p, d, names)
    await hand.start()
    res: dict[str, Any] = {"model": label, "kv_dtype": hand.layout.kv_dtype, "codecs": names}
    try:
        prompts = prompts_for(p, model, args.random_prompts)
        gen: dict[str, list[list[int]]] = {n: [] for n in names}
        for _kind, ids in prompts:
            for name in names:
                gen[name].append(await hand.generate(ids, name, args.max_new))
        # perplexity over windows, through the transfer into a scratch receiver
        windows = ppl_windows(p, model, args.windows, args.context + args.continuation)
        nblocks = -(-(args.context + args.continuation) // 16)
        shape = list(p.remote.kv_cache.shape)
        shape[2] = nblocks
        scratch = torch.zeros(shape, dtype=p.remote.kv_cache.dtype)
        rx = Receiver(scratch, hand.layout, ReceiverConfig(
            SECRET, enable_shm=False, codecs=tuple(n for n in names if n != "raw")))
        endpoint = await rx.start()
        nll = {n: 0.0 for n in names}
        moved = {n: [0, 0] for n in names}
        count = 0
        for i, w in enumerate(windows):
            got, sizes = await continuation_nll(p.runner, hand.layout, w, args.context, names,
                                                rx, endpoint, f"w{i}")
            for n in names:
                nll[n] += got[n]
                moved[n][0] += sizes[n][0]
                moved[n][1] += sizes[n][1]
            count += len(w) - args.context - 1
        await rx.close()
    finally:
        await hand.close()
    ref = gen["raw"]
    for name in names:
        same_pos = total = whole = prefix = 0
        for a, b in zip(ref, gen[name], strict=True):
            total += len(a)
            same_pos += sum(x == y for x, y in zip(a, b, strict=False))
            whole += a == b
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            prefix += k
        ppl = math.exp(nll[name] / count)
        res[name] = {"token_agreement": same_pos / total, "sequences_equal": whole / len(ref),
                     "mean_equal_prefix": prefix / len(ref), "perplexity": ppl,
                     "wire_per_raw_byte": moved[name][0] / moved[name][1]}
    base = res["raw"]["perplexity"]
    for name in names:
        res[name]["perplexity_delta"] = res[name]["perplexity"] / base - 1
    res["prompts"] = len(ref)
    res["tokens_per_prompt"] = args.max_new
    res["ppl_tokens"] = count
    return res


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,tiny")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--random-prompts", type=int, default=16, help="prompts on the tiny model")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--context", type=int, default=384)
    ap.add_argument("--continuation", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    results = {}
    for model in args.models.split(","):
        t0 = time.perf_counter()
        results[model] = asyncio.run(measure(model, args))
        results[model]["seconds"] = time.perf_counter() - t0
        results[model]["load"] = os.getloadavg()[0]
    print(f"{'model':>10} {'codec':>6} {'wire/raw':>8} {'token agree':>11} {'seq equal':>9} "
          f"{'prefix':>6} {'ppl':>8} {'ppl delta':>9}")
    for model, r in results.items():
        for name in r["codecs"]:
            c = r[name]
            print(f"{model:>10} {name:>6} {c['wire_per_raw_byte']:8.3f} "
                  f"{c['token_agreement']:11.2%} {c['sequences_equal']:9.0%} "
                  f"{c['mean_equal_prefix']:6.1f} {c['perplexity']:8.3f} "
                  f"{c['perplexity_delta']:+9.3%}")
        print(f"{model:>10}: {r['model']}, KV {r['kv_dtype']}, {r['prompts']} prompts x "
              f"{r['tokens_per_prompt']} tokens, perplexity over {r['ppl_tokens']} tokens, "
              f"{r['seconds']:.0f} s, load {r['load']:.1f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lossy_quality.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
