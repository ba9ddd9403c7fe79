"""DeepSeek-V2/V3 on the fused native CPU forward: their routers (moe_experts.h) against the
torch routers (tandem/engine/models/layers/moe_routing.py, transformers' numerics), and whole
models, multi-head latent attention (mla_attention.h) and MoE layers, against the torch forward
and transformers.

Routers: the kernels' choice of experts must be the torch routers' (as sets: torch's top-k is
unsorted) and their weights equal to fp32 summation order (a softmax over up to 256
experts: 1e-5 relative, measured <= 1.4e-6), on random logits, on
logits full of ties, with groups masking experts the ungrouped choice would take, and with
V3's correction bias changing the choice but never entering the weights.

Whole models: tiny perturbed checkpoints, layer 0 dense and layers 1-2 MoE, every parameter
away from transformers' initialisation; the MLA widths the kernels' Lins take (inputs a
multiple of 32: ``v_head_dim`` 24 for o_proj's 4 x 24 inputs, V3's ``q_lora_rank`` 96). The
native path attends in latent space on every row, the torch path decompresses prefill rows:
equal in exact arithmetic; in fp32 they differ by summation order (measured <= 1e-6 on the
logits): 1e-5 relative. Greedy tokens must be equal, to the torch path and to transformers,
and a sequence prefilled on one path continues on the other (the same latent cache).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.models.arch import ModelArch, MoeArch
from tandem.engine.models.layers import SparseMoE
from tandem.engine.models.layers.moe_routing import deepseek_v2_topk, deepseek_v3_topk
from tandem.engine.native import NativeLinear, load, unsupported_reason
from tandem.engine.native.moe_layer import NativeMoe, moe_unsupported
from tests.unit.engine._handoff import handoff_token_ids
from tests.unit.engine._reference import engine_token_ids, hf_greedy
from tests.unit.engine.native._torch_steps import rel_err, torch_logits

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
TOL = 1e-5
BLOCK = 4
# the MLA widths the kernels take (module docstring); three layers, layer 0 dense
NATIVE_MLA = {"num_layers": 3, "first_k_dense_replace": 1, "v_head_dim": 24}
# name -> (arch, make_tiny_checkpoint options)
CASES = {
    # V2: q from the hidden state, greedy top 2 of 8, two shared experts
    "v2": ("deepseek_v2", NATIVE_MLA),
    # V2: group-limited greedy (2 of 4 groups), routed scaling, biased latent/o/MLP projections
    "v2-grouped-biases": ("deepseek_v2", {**NATIVE_MLA, "topk_method": "group_limited_greedy",
                                          "n_group": 4, "topk_group": 2,
                                          "routed_scaling_factor": 1.5,
                                          "attention_bias": True, "mlp_bias": True}),
    # V3: q-LoRA, sigmoid scores, bias-corrected choice within 2 of 4 groups, renormalised
    "v3": ("deepseek_v3", {**NATIVE_MLA, "q_lora_rank": 96}),
    # V3 unnormalised, another scaling, RoPE on halves, biased latent projections
    "v3-unnormalised": ("deepseek_v3", {**NATIVE_MLA, "q_lora_rank": 96,
                                        "norm_topk_prob": False, "routed_scaling_factor": 0.7,
                                        "rope_interleave": False, "attention_bias": True}),
    # yarn: mscale_all_dim in the softmax scale, the attention factor in the RoPE tables;
    # prompts cross the original context
    "v3-yarn": ("deepseek_v3", {**NATIVE_MLA, "q_lora_rank": 96, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}}),
}


# --- routers ---------------------------------------------------------------------------------

def _block(moe: MoeArch, bias: torch.Tensor | None = None, seed: int = 0) -> SparseMoE:
    """A MoE block of ``moe`` with random weights and V3 correction bias (``bias`` when
    given)."""
    arch = ModelArch(model_type="test", vocab_size=256, hidden_size=64,
                     intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=4,
                     head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     max_position_embeddings=256, eos_token_ids=(2,), moe=moe)
    block = SparseMoE(arch)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        if bias is not None:
            block.gate.e_score_correction_bias.copy_(bias)
    return block


def _native_router(moe: MoeArch, bias: torch.Tensor | None = None,
                   ) -> tuple[NativeMoe, SparseMoE]:
    """:func:`_block` and the kernels' side of it."""
    block = _block(moe, bias)
    return NativeMoe(block, NativeLinear), block


def _torch_route(block: SparseMoE, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch router's (weights, ids) for ``logits`` (Router.forward past its matmul)."""
    m = block.gate.moe
    if m.routing == "deepseek_v2":
        return deepseek_v2_topk(logits, m.top_k, m.topk_method, m.n_group, m.topk_group,
                                m.routed_scaling_factor)
    return deepseek_v3_topk(logits, block.gate.e_score_correction_bias.detach(), m.top_k,
                            m.n_group, m.topk_group, m.routed_scaling_factor, m.norm_topk_prob)


def _by_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (weights, ids) in ascending id order (torch's top-k is unsorted)."""
    ids, order = ids.sort(dim=-1)
    return weights.gather(1, order), ids


def _assert_routes_equal(native: NativeMoe, block: SparseMoE, logits: torch.Tensor) -> None:
    w_nat, id_nat = _by_id(*native.route(logits))
    w_ref, id_ref = _by_id(*_torch_route(block, logits))
    assert torch.equal(id_nat, id_ref), (id_nat != id_ref).any(-1).nonzero()[:5]
    torch.testing.assert_close(w_nat, w_ref, rtol=1e-5, atol=1e-6)


def _v2(experts: int = 8, k: int = 2, groups: tuple[int, int] = (1, 1),
        scaling: float = 1.0) -> MoeArch:
    return MoeArch(num_experts=experts, top_k=k, expert_intermediate_size=32,
                   sparse_layers=(0,), routing="deepseek_v2", norm_topk_prob=False,
                   topk_method="greedy" if groups == (1, 1) else "group_limited_greedy",
                   n_group=groups[0], topk_group=groups[1], routed_scaling_factor=scaling)


def _v3(experts: int = 8, k: int = 2, groups: tuple[int, int] = (4, 2), scaling: float = 2.5,
        norm: bool = True) -> MoeArch:
    return MoeArch(num_experts=experts, top_k=k, expert_intermediate_size=32,
                   sparse_layers=(0,), routing="deepseek_v3", norm_topk_prob=norm,
                   topk_method="noaux_tc", n_group=groups[0], topk_group=groups[1],
                   routed_scaling_factor=scaling)


ROUTERS = {
    "v2-greedy": _v2(),
    "v2-grouped": _v2(k=3, groups=(4, 2), scaling=1.5),
    # DeepSeek-V2's own shape: 160 experts in 8 groups, 3 of them, 6 per token
    "v2-160": _v2(experts=160, k=6, groups=(8, 3), scaling=16.0),
    "v3": _v3(),
    "v3-unnormalised": _v3(scaling=0.7, norm=False),
    # DeepSeek-V3's own shape: 256 experts in 8 groups, 4 of them, 8 per token
    "v3-256": _v3(experts=256, k=8, groups=(8, 4)),
}


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_matches_torch_on_random_logits(name: str) -> None:
    moe = ROUTERS[name]
    native, block = _native_router(moe)
    logits = torch.randn(400, moe.num_experts, generator=torch.Generator().manual_seed(1)) * 3
    _assert_routes_equal(native, block, logits)


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_breaks_ties_as_torch_does(name: str) -> None:
    """Logits of four distinct values (every row full of equal scores, some rows all equal):
    the same experts as torch's top-k, group ties included. The values are chosen so that
    unequal pairs never sum equal (V3 ranks a group by its two best: sigmoid(x) +
    sigmoid(-x) would be 1 for every x, a tie only up to rounding)."""
    moe = ROUTERS[name]
    # V3: no correction bias, so equal scores are equal choices
    bias = torch.zeros(moe.num_experts) if moe.routing == "deepseek_v3" else None
    native, block = _native_router(moe, bias)
    g = torch.Generator().manual_seed(2)
    values = torch.tensor([0.0, 0.5, 1.5, 3.0])
    logits = values[torch.randint(0, 4, (300, moe.num_experts), generator=g)]
    logits[:10] = 0.5  # every expert (and group) equal
    _assert_routes_equal(native, block, logits)


@pytest.mark.parametrize("name", ["v2-grouped", "v2-160", "v3", "v3-256"])
def test_groups_mask_experts_the_ungrouped_choice_takes(name: str) -> None:
    """Group-limited choice equals torch's, and differs from the choice over all experts on
    some rows (the mask is exercised, not vacuous)."""
    moe = ROUTERS[name]
    native, block = _native_router(moe)
    logits = torch.randn(400, moe.num_experts, generator=torch.Generator().manual_seed(3)) * 3
    _assert_routes_equal(native, block, logits)
    _, grouped = _by_id(*native.route(logits))
    if moe.routing == "deepseek_v2":
        _, free = _by_id(*deepseek_v2_topk(logits, moe.top_k, "greedy", 1, 1, 1.0))
    else:
        bias = block.gate.e_score_correction_bias.detach()
        _, free = _by_id(*deepseek_v3_topk(logits, bias, moe.top_k, 1, 1, 1.0, True))
    assert (grouped != free).any(-1).float().mean() > 0.05


def test_correction_bias_changes_the_choice_not_the_weights() -> None:
    """V3: a large bias on experts 0..3 makes them chosen where their scores alone would not
    be; the weights stay the chosen experts' sigmoid scores (renormalised, x scaling), which a
    bias leaking into the weights would change."""
    moe = _v3(groups=(1, 1), scaling=2.5)
    bias = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.0, 0.0, 0.0, 0.0])
    native, block = _native_router(moe, bias)
    logits = torch.randn(300, 8, generator=torch.Generator().manual_seed(4))
    logits[:, 4:] += 1.0  # unbiased, experts 4..7 would usually win
    _assert_routes_equal(native, block, logits)
    weights, ids = native.route(logits)
    _, unbiased = _by_id(*deepseek_v3_topk(logits, torch.zeros(8), 2, 1, 1, 1.0, True))
    assert (_by_id(weights, ids)[1] != unbiased).any(-1).float().mean() > 0.5
    scores = torch.sigmoid(logits).gather(1, ids)
    expected = scores / scores.sum(-1, keepdim=True) * 2.5
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=1e-7)
    leaked = (scores + bias[ids]) / (scores + bias[ids]).sum(-1, keepdim=True) * 2.5
    assert (weights - leaked).abs().max() > 0.1


def test_every_router_is_native_up_to_the_group_limit() -> None:
    for moe in (_v2(), _v3(), MoeArch(num_experts=8, top_k=2, expert_intermediate_size=32,
                                      sparse_layers=(0,))):
        assert moe_unsupported(_block(moe)) is None, moe.routing
    many = _v2(experts=512, k=2, groups=(512, 1))
    reason = moe_unsupported(_block(many)) or ""
    assert "512 expert groups" in reason


# --- whole models ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ds_dir(family_dir: Callable[..., Path]) -> Callable[[str], Path]:
    """``ds_dir(case)``: the checkpoint of one of CASES (tests/unit/engine/conftest.py's
    ``family_dir``: written once per session)."""

    def get(case: str) -> Path:
        arch, options = CASES[case]
        return family_dir(arch, **options)

    return get


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize(("case", "quant"), [(case, "none") for case in CASES] + [
    ("v2-grouped-biases", "int8"), ("v3", "int8")])
def test_forward_matches_torch(make_engine, ds_dir, exact_torch_path, case: str,
                               quant: str) -> None:
    """A prefill of 12 sequences in one step, then decode steps of 1, 5 and 12 rows: the
    native logits and latent cache equal the torch path's. int8 (every linear but
    kv_b_proj, experts included): the torch path multiplies by the exact dequantized weights,
    the kernels' few-row loops round activations to int16 (measured <= 6.4e-5, as for the
    other MoE models): 5e-4."""
    engine = make_engine(model=str(ds_dir(case)), dtype="float32", quantization=quant,
                         num_blocks=128, block_size=BLOCK)
    tol = TOL if quant == "none" else 5e-4
    runner = engine.runner
    assert runner.fused is not None, unsupported_reason(runner.model, runner.kv_cache.dtype)
    assert runner.kv_cache.shape[1:] == (1, 128, BLOCK, 1, 32 + 8)  # the latent cache
    seqs = 12
    lengths = [3 + 2 * i for i in range(seqs)]  # 3..25 tokens, up to 7 blocks
    tables = [list(range(1 + 8 * i, 9 + 8 * i)) for i in range(seqs)]
    kv_ref, kv_nat = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)

    def step(ids: list[int], positions: list[int], seq: list[int]) -> None:
        ref = torch_logits(runner, ids, positions, seq, tables, kv_ref)
        nat = runner.fused(ids, positions, seq, tables, kv_nat, range(len(ids)))
        assert rel_err(nat, ref) < tol, (case, quant, len(ids), rel_err(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), (case, len(ids))

    prompts = _prompts(lengths, seed=2)
    step([t for p in prompts for t in p], [i for n in lengths for i in range(n)],
         [s for s, n in enumerate(lengths) for _ in range(n)])
    g = torch.Generator().manual_seed(3)
    for n in (1, 5, seqs):
        ids = torch.randint(3, 256, (n,), generator=g).tolist()
        step(ids, [lengths[s] for s in range(n)], list(range(n)))
        for s in range(n):
            lengths[s] += 1
    assert rel_err(kv_nat, kv_ref) < tol


@pytest.mark.parametrize("budget", [None, 8], ids=["whole", "chunked"])
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_transformers(make_engine, ds_dir, case: str,
                                    budget: int | None) -> None:
    path = ds_dir(case)
    extra = {} if budget is None else {"max_num_batched_tokens": budget}
    engine = make_engine(model=str(path), num_blocks=128, block_size=BLOCK, **extra)
    assert engine.runner.fused is not None
    prompts = _prompts([3, 9, 30, 75], seed=1)
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), case


@pytest.mark.parametrize("native_prefill", [True, False], ids=["native-to-torch",
                                                               "torch-to-native"])
@pytest.mark.parametrize("case", ["v2-grouped-biases", "v3"])
def test_handoff_between_the_paths(make_engine, ds_dir, case: str,
                                   native_prefill: bool) -> None:
    """Prefill on one path, the latent blocks shipped layer by layer, decode on the other:
    transformers' tokens (both paths read and write the same latent rows)."""
    path = ds_dir(case)
    prefill, decode = (make_engine(model=str(path), num_blocks=64, block_size=BLOCK,
                                   use_native_kernels=native)
                       for native in (native_prefill, not native_prefill))
    assert (prefill.runner.fused is not None) == native_prefill
    assert (decode.runner.fused is not None) != native_prefill
    prompt = _prompts([41], seed=4)[0]
    tokens = handoff_token_ids(prefill, decode, prompt, GREEDY)
    assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


def test_prefix_cache_hits_on_latent_blocks(make_engine, ds_dir) -> None:
    """A second request sharing 24 prompt tokens reads their latent blocks from the prefix
    cache (written by the native path) and still gives transformers' tokens."""
    path = ds_dir("v3")
    engine = make_engine(model=str(path), num_blocks=128, block_size=BLOCK)
    assert engine.runner.fused is not None
    shared = _prompts([24], seed=2)[0]
    first = engine_token_ids(engine, [shared + [5, 6]], GREEDY)[0]
    hits = engine.stats().prefix_cache_hits
    second = engine_token_ids(engine, [shared + [9, 10, 11]], GREEDY)[0]
    assert engine.stats().prefix_cache_hits - hits == 24
    assert first == hf_greedy(path, shared + [5, 6], GREEDY.max_tokens)
    assert second == hf_greedy(path, shared + [9, 10, 11], GREEDY.max_tokens)


def test_auto_keeps_the_latent_cache_in_the_model_dtype(make_engine, ds_dir) -> None:
    """The fused path serves the MLA model over an fp32 latent cache under ``auto`` (no
    float16 cache as for a GQA model), and refuses an int8 or fp8 one by name."""
    engine = make_engine(model=str(ds_dir("v3")), num_blocks=32, block_size=BLOCK,
                         kv_cache_dtype="auto")
    assert engine.runner.fused is not None
    assert engine.runner.kv_cache.dtype == torch.float32
    reason = unsupported_reason(engine.runner.model, torch.int8) or ""
    assert "int8 latent" in reason
    reason = unsupported_reason(engine.runner.model, torch.float8_e4m3fn) or ""
    assert "fp8 latent" in reason
