"""The cost of LoRA in a decode step: 8 rows over 4 adapters against the base model's step.

    python -m bench.engine.lora_step [--rows 8] [--adapters 4] [--rank 16] [--steps 12]
                                     [--threads 2]

On the default model (SmolLM2-135M's Q4_1 GGUF), with ``--adapters`` random PEFT adapters of
``--rank`` on q/k/v/o and gate/up/down, ``--rows`` sequences of 64 prompt tokens decode
together; the fastest of ``--steps`` decode steps is taken for each of:

    base, native     every row on the base model: the fused native CPU forward
    lora, native     rows spread over the adapters round-robin: the fused forward adding each
                     row's delta (tandem/engine/native/lora_delta.h)
    lora, torch      the same rows on the torch forward (the adapters' hooks: the reference,
                     and the path where the fused forward is off)
    base, torch      every row on the base model, torch forward

and the ratios lora-native/base-native (what serving adapters costs a CPU step),
lora-torch/lora-native and lora-torch/base-torch (the torch path's deltas alone). Indicative:
one run, a shared machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from tandem.engine import EngineConfig, LLMEngine, SamplingParams
from tandem.engine.loader import resolve_model
from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import make_tiny_adapter


def _step_time(engine: LLMEngine, loras: list[str], steps: int) -> float:
    """Fastest decode step (seconds) of ``len(loras)`` rows under those adapters."""
    for i, lora in enumerate(loras):
        engine.add_request([3 + (i * 37 + k * 11) % 40000 for k in range(64)],
                           SamplingParams(temperature=0.0, max_tokens=steps + 4,
                                          ignore_eos=True, lora=lora))
    engine.step()  # the prefills
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        best = min(best, time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    base = resolve_model("smollm2")
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"a{i}" for i in range(a.adapters)]
        modules = tuple((n, str(make_tiny_adapter(base, Path(tmp) / n, rank=a.rank, seed=i,
                                                  scale=0.02)))
                        for i, n in enumerate(names))
        engine = LLMEngine(EngineConfig.from_kwargs(
            model="smollm2", num_blocks=256, lora=LoraConfig(
                enabled=True, modules=modules, max_loras=a.adapters, max_lora_rank=a.rank)),
            progress=False)
        rows = [names[i % a.adapters] for i in range(a.rows)]
        native = _step_time(engine, [""] * a.rows, a.steps)
        lora_native = _step_time(engine, rows, a.steps)
        fused, engine.runner.fused = engine.runner.fused, None
        lora_torch = _step_time(engine, rows, a.steps)
        torch_base = _step_time(engine, [""] * a.rows, a.steps)
        engine.runner.fused = fused
    print(f"{a.rows} decode rows, {a.adapters} adapters of rank {a.rank}, "
          f"{a.threads} threads ({engine.weights_format})")
    print(f"  base, native  {native * 1e3:8.2f} ms")
    print(f"  lora, native  {lora_native * 1e3:8.2f} ms")
    print(f"  lora, torch   {lora_torch * 1e3:8.2f} ms")
    print(f"  base, torch   {torch_base * 1e3:8.2f} ms")
    print(f"  lora-native / base-native {lora_native / native:.2f}x   lora-torch / "
          f"lora-native {lora_torch / lora_native:.2f}x   lora-torch / base-torch "
          f"{lora_torch / torch_base:.2f}x")


if __name__ == "__main__":
    main()
