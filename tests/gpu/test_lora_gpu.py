"""Multi-LoRA on a CUDA device: the Triton shrink/expand deltas equal the torch path's.

Two engines on the same GPU, one with the Triton kernels (the default on CUDA), one with the
torch gather-matmul reference (``LoraManager.use_triton = False``), three adapters of ranks
4/8/16 and base rows mixed in each step: greedy outputs equal, and each adapter moves the
output away from the base model's. The adapters are PEFT-layout directories written with
safetensors alone (no ``peft`` on the device image). Skipped without CUDA; run by
scripts/gpu_check.sh on a lent GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import ALL_TARGETS, greedy_under_adapters, write_random_adapter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_triton_lora_equals_torch_path(tiny_dir, make_engine, tmp_path) -> None:
    base = tiny_dir("llama", 2)
    dirs = {"a": write_random_adapter(base, tmp_path / "a", 8, 1),
            "b": write_random_adapter(base, tmp_path / "b", 4, 2, ("q_proj", "v_proj",
                                                                   "down_proj")),
            "c": write_random_adapter(base, tmp_path / "c", 16, 3, ALL_TARGETS)}
    lora = LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, p in dirs.items()),
                      max_loras=3, max_lora_rank=16)
    kw = dict(model=str(base), device="cuda", dtype="float32", num_blocks=256, block_size=16,
              attention_backend="triton", lora=lora)
    tri = make_engine(**kw)
    ref = make_engine(**kw)
    assert tri.loras.use_triton
    ref.loras.use_triton = False
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 60, (8,), generator=g)]
    names = ["a", "b", "", "c", "a", "", "b", "c"]
    jobs = [(p, n, 12 if n else 20) for p, n in zip(prompts, names, strict=True)]
    got = greedy_under_adapters(tri, jobs)
    assert got == greedy_under_adapters(ref, jobs)
    base_out = greedy_under_adapters(ref, [(p, "", m) for p, _, m in jobs])
    for (_, n, _), tokens, plain in zip(jobs, got, base_out, strict=True):
        assert (tokens != plain) == bool(n), n  # adapters move the output, base rows do not
