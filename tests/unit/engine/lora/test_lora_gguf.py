"""LoRA on the default model's quantized weights: SmolLM2's Q4_1 GGUF (served from its
blocks, tandem/engine/native) plus a random adapter on q/k/v/o and the MLP, against PEFT on
the same GGUF dequantized to float32 (the converted checkpoint transformers reads)."""

from __future__ import annotations

import pytest

from tandem.engine import SamplingParams
from tandem.engine.lora import LoraConfig
from tandem.engine.testing.lora import make_tiny_adapter, peft_greedy

pytestmark = pytest.mark.slow

NEW = 8


def test_adapter_on_the_gguf_default_model_matches_peft(make_engine, smollm2_dir,
                                                        tmp_path) -> None:
    adapter = make_tiny_adapter(smollm2_dir, tmp_path / "smol-lora", rank=8, seed=21,
                                scale=0.05)
    engine = make_engine(model="smollm2", num_blocks=64,
                         lora=LoraConfig(enabled=True, modules=(("smol", str(adapter)),),
                                         max_lora_rank=8))
    assert "Q4_1" in engine.weights_format
    tok = engine.tokenizer
    prompts = [tok.encode(t) for t in ("The capital of France is", "def fibonacci(n):",
                                       "Once upon a time, in a village")]
    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=NEW,
                                                ignore_eos=True, lora=lora))
           for p in prompts for lora in ("smol", "")]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    got = [done[i] for i in ids]
    moved = 0
    for k, prompt in enumerate(prompts):
        with_adapter, base = got[2 * k], got[2 * k + 1]
        assert with_adapter == peft_greedy(smollm2_dir, adapter, prompt, NEW)
        assert base == peft_greedy(smollm2_dir, None, prompt, NEW)
        moved += with_adapter != base
    assert moved  # the adapter changes what the model says
