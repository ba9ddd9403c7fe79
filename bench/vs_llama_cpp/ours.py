"""Our engine's side of bench/vs_llama_cpp/compare.py: the three rows that need no server.

    decode      one greedy stream of n tokens from a short prompt: ms per token after the
                first (llama-bench tg<n> times n tokens of generation alone)
    prefill     one prompt of n random tokens: time to its first token (llama-bench pp<n>)
    batched     b sequences of p random prompt tokens, g output tokens each: output tokens
                per second over the steps after every prompt is prefilled (llama-batched-bench
                S_TG, whose sequences decode together after their prompts)

Every request is greedy with ``ignore_eos`` (fixed lengths, as llama.cpp's benches run), and
the prefix cache is emptied before each run: repeats must not reuse the last one's KV.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine import LLM, SamplingParams

# Plain text, so a greedy continuation is ordinary prose (random ids make the model loop).
DECODE_PROMPT = "The history of the lighthouse begins with"


@dataclass(slots=True)
class Stream:
    """One request's timing: send -> first token, first -> last token, tokens generated."""

    ttft_s: float
    after_first_s: float
    tokens: int

    @property
    def ms_per_token(self) -> float:
        """Mean ms per output token after the first (TPOT)."""
        return 1e3 * self.after_first_s / max(self.tokens - 1, 1)


def _params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)


def random_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` random token ids (seeded; no shared prefixes)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(count)]


def load(threads: int) -> LLM:
    """The default model with the engine's defaults, ``threads`` CPU threads."""
    return LLM("smollm2", progress=False, num_threads=threads)


def stream(llm: LLM, prompt: str | Sequence[int], n: int) -> Stream:
    """Run one request of exactly ``n`` tokens alone, stepping the engine ourselves."""
    eng = llm.engine
    eng.kv.pool.reset_prefix_cache()
    t0 = time.perf_counter()
    rid = eng.add_request(prompt, _params(n))
    first = 0.0
    tokens = 0
    while True:
        outs = [o for o in eng.step() if o.request_id == rid]
        now = time.perf_counter()
        if outs and not first and outs[-1].token_ids:
            first = now
        if outs and outs[-1].finished:
            tokens = len(outs[-1].token_ids)
            return Stream(first - t0, now - first, tokens)


def batched_decode_tok_s(llm: LLM, prompts: list[list[int]], n: int) -> tuple[float, int]:
    """(output tokens/s after every prompt got its first token, tokens counted) for
    ``prompts`` run together, ``n`` tokens each."""
    eng = llm.engine
    eng.kv.pool.reset_prefix_cache()
    rids = {eng.add_request(p, _params(n)) for p in prompts}
    counts = dict.fromkeys(rids, 0)
    done: set[str] = set()
    start = 0.0
    at_start = 0
    while len(done) < len(rids):
        for out in eng.step():
            counts[out.request_id] = len(out.token_ids)
            if out.finished:
                done.add(out.request_id)
        if not start and all(counts.values()):  # the last prefill just finished
            start, at_start = time.perf_counter(), sum(counts.values())
    decoded = sum(counts.values()) - at_start
    assert all(c == n for c in counts.values()), counts
    return decoded / (time.perf_counter() - start), decoded


def warm(llm: LLM) -> None:
    """First-call costs (allocations, kernel set-up) out of the timed runs."""
    vocab = llm.engine.arch.vocab_size
    llm.generate(random_prompts(vocab, 4, 64, seed=99), _params(8))


def run_ours(llm: LLM, decode_n: int, prefill_n: int, batch: tuple[int, int, int],
             repeats: int, note) -> dict[str, dict[str, float]]:
    """Medians of ``repeats`` runs of each row; ``batch`` is (sequences, prompt, output)."""
    vocab = llm.engine.arch.vocab_size
    warm(llm)
    note(f"ours: decode {decode_n} tokens x{repeats}")
    runs = [stream(llm, DECODE_PROMPT, decode_n) for _ in range(repeats)]
    decode = {"ms_per_tok": statistics.median(r.ms_per_token for r in runs),
              "tokens": runs[0].tokens}
    note(f"  {decode['ms_per_tok']:.2f} ms/token")
    note(f"ours: prefill {prefill_n} tokens x{repeats}")
    ttfts = [stream(llm, p, 1).ttft_s
             for p in random_prompts(vocab, repeats, prefill_n, seed=1)]
    prefill = {"ttft_s": statistics.median(ttfts)}
    prefill["tok_s"] = prefill_n / prefill["ttft_s"]
    note(f"  TTFT {prefill['ttft_s'] * 1e3:.0f} ms = {prefill['tok_s']:.0f} prompt tok/s")
    seqs, plen, out = batch
    note(f"ours: batched decode {seqs} x ({plen} in, {out} out) x{repeats}")
    rates = [batched_decode_tok_s(llm, random_prompts(vocab, seqs, plen, seed=10 + i), out)[0]
             for i in range(repeats)]
    batched = {"tok_s": statistics.median(rates)}
    note(f"  {batched['tok_s']:.1f} decode tok/s")
    return {"decode": decode, "prefill": prefill, "batched": batched}
