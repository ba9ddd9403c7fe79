"""Mixture-of-experts families against transformers: greedy output equal token for token,
fp32, on tiny checkpoints (8 experts, 2 per token) whose every parameter is perturbed
(routers, experts, shared experts and their gate, biases, norms: tandem/engine/testing/
perturb.py), with and without sliding windows, through the torch forward and the fused
native one (moe_experts.h); colocated, and for one family through a P/D handoff."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.models.layers import MLP, SparseMoE
from tandem.engine.native import load
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine._reference import engine_token_ids, hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

# name -> (arch, make_tiny_checkpoint options, which layers are sparse)
CASES = {
    "mixtral": ("mixtral", {}, [True, True]),
    # a shared expert behind its sigmoid gate; layer 1 dense (mlp_only_layers); q/k/v biases
    "qwen2-moe": ("qwen2_moe", {"num_layers": 3, "mlp_only_layers": [1]}, [True, False, True]),
    # renormalised top-k; every second layer sparse (decoder_sparse_step); o and q/k/v biases
    "qwen3-moe": ("qwen3_moe", {"num_layers": 3, "norm_topk_prob": True,
                                "decoder_sparse_step": 2, "attention_bias": True},
                  [False, True, False]),
    # every layer attends through a window shorter than the prompts
    "mixtral-sliding-window": ("mixtral", {"sliding_window": 24}, [True, True]),
    "qwen3-moe-sliding-window": ("qwen3_moe", {"use_sliding_window": True,
                                               "sliding_window": 24}, [True, True]),
}


PATHS = ["torch", pytest.param("native", marks=pytest.mark.skipif(
    load() is None, reason="native kernels unavailable here"))]


def _prompts(lengths: tuple[int, ...] = (9, 60, 200)) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("path_kind", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_transformers(family_dir, make_engine, case: str, path_kind: str) -> None:
    arch, options, sparse = CASES[case]
    path = family_dir(arch, **options)
    engine = make_engine(model=str(path), num_blocks=64, block_size=16,
                         use_native_kernels=path_kind == "native")
    assert (engine.runner.fused is not None) == (path_kind == "native")
    layers = engine.runner.model.layers
    assert [isinstance(layer.mlp, SparseMoE) for layer in layers] == sparse
    assert [layer.self_attn.window for layer in layers] == [options.get("sliding_window")] * len(
        layers)
    assert all(isinstance(layer.mlp, SparseMoE | MLP) for layer in layers)
    prompts = _prompts()
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), case


@pytest.mark.parametrize("prefill_kind", PATHS)
def test_qwen2_moe_handoff_equals_colocated(family_dir, make_engine, prefill_kind: str) -> None:
    """Prefill on P (torch, or the fused native forward), the prompt's blocks copied layer by
    layer as the push would, decode on D (torch): transformers' tokens."""
    path = family_dir("qwen2_moe")
    prefill = make_engine(model=str(path), num_blocks=32, block_size=16,
                          use_native_kernels=prefill_kind == "native")
    assert (prefill.runner.fused is not None) == (prefill_kind == "native")
    decode = make_engine(model=str(path), num_blocks=32, block_size=16, use_native_kernels=False)
    prompt = _prompts((45,))[0]
    expected = hf_greedy(path, prompt, GREEDY.max_tokens)

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id="r1")
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    src = prefill.remote.prefill.held_block_ids(rid)
    dst = decode.remote.decode.reserve("r1", prompt, GREEDY).fill_block_ids
    assert len(dst) == len(src) == -(-45 // 16)
    copy_blocks(prefill, src, decode, dst, layer_by_layer=True)
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("r1", first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    assert tokens == expected
