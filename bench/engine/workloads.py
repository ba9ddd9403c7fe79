"""Workloads for bench/engine/vs_transformers.py, and the transformers side of each comparison."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Workload:
    """Prompts (token ids) and the number of tokens to generate for each."""

    prompts: list[list[int]]
    outputs: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def describe(self) -> str:
        lens = [len(p) for p in self.prompts]
        return (f"{len(self.prompts)} requests, prompts {min(lens)}..{max(lens)}, "
                f"outputs {min(self.outputs)}..{max(self.outputs)}")


def _tokens(g: torch.Generator, vocab: int, n: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=g).tolist()


def batch_workload(vocab: int, n: int = 64, prompt: int = 128, out: int = 128) -> Workload:
    g = torch.Generator().manual_seed(0)
    return Workload([_tokens(g, vocab, prompt) for _ in range(n)], [out] * n)


def mixed_workload(vocab: int, n: int = 64, quick: bool = False) -> Workload:
    g = torch.Generator().manual_seed(1)
    hi_p, hi_o = (256, 64) if quick else (1024, 256)
    plens = torch.randint(16, hi_p + 1, (n,), generator=g).tolist()
    olens = torch.randint(16, hi_o + 1, (n,), generator=g).tolist()
    return Workload([_tokens(g, vocab, p) for p in plens], olens)


def single_workload(vocab: int, prompt: int = 16, out: int = 128) -> Workload:
    g = torch.Generator().manual_seed(2)
    return Workload([_tokens(g, vocab, prompt)], [out])


@torch.inference_mode()
def hf_static_generate(model: torch.nn.Module, wl: Workload, batch: int) -> float:
    """Seconds for transformers to run the workload in static, left-padded batches."""
    t0 = time.perf_counter()
    for i in range(0, len(wl.prompts), batch):
        prompts = wl.prompts[i : i + batch]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        n = max(wl.outputs[i : i + batch])
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)
    return time.perf_counter() - t0


def measure_read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second of a full read of a buffer far larger than the caches (best of N)."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    buf.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of distinct parameters (tied weights once; CPU fp32 shadows excluded)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total
