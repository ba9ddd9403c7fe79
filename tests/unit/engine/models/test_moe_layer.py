"""The mixture-of-experts block at module level: the grouped expert compute against the
per-row reference (1, few and many rows per expert; each active expert called once, idle
ones never), one rank's held experts under expert parallelism (their terms only), and the DeepSeek-V2/V3 block (routers, routed scaling, shared experts) against
transformers' own DeepseekV2Moe / DeepseekV3Moe on the same perturbed weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tandem.engine.models.arch import ModelArch, MoeArch
from tandem.engine.models.layers import SparseMoE
from tandem.engine.models.layers.moe_experts import Experts, per_row_reference
from tandem.engine.models.moe_config import deepseek_moe
from tandem.engine.testing.perturb import perturb_parameters

HIDDEN = 64


def _arch(moe: MoeArch | None = None, hidden: int = HIDDEN) -> ModelArch:
    return ModelArch(model_type="test", vocab_size=256, hidden_size=hidden,
                     intermediate_size=2 * hidden, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=hidden // 4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     max_position_embeddings=256, eos_token_ids=(2,), moe=moe)


def _experts(num_experts: int = 8) -> Experts:
    experts = Experts(_arch(), num_experts, 48)
    perturb_parameters(experts, seed=3)
    return experts


def _count_calls(experts: Experts) -> list[int]:
    calls = [0] * len(experts)
    for e, expert in enumerate(experts):
        expert.register_forward_hook(lambda *_, e=e: calls.__setitem__(e, calls[e] + 1))
    return calls


def _routing(rows: int, k: int, num_experts: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=g)
    return torch.randn(rows, HIDDEN, generator=g), ids, weights


@pytest.mark.parametrize("rows", [1, 3, 200], ids=["one-row", "few-rows", "many-rows"])
def test_grouped_experts_equal_the_per_row_reference(rows: int) -> None:
    experts = _experts()
    x, ids, weights = _routing(rows, 2, len(experts), seed=rows)
    calls = _count_calls(experts)
    got = experts(x, ids, weights)
    active = set(ids.flatten().tolist())
    assert calls == [int(e in active) for e in range(len(experts))]  # once each, idle never
    torch.testing.assert_close(got, per_row_reference(experts, x, ids, weights))


def test_one_row_per_expert() -> None:
    """Four tokens x two experts over eight experts: every expert serves exactly one row."""
    experts = _experts()
    x, _, weights = _routing(4, 2, 8, seed=5)
    ids = torch.randperm(8, generator=torch.Generator().manual_seed(5)).view(4, 2)
    calls = _count_calls(experts)
    got = experts(x, ids, weights)
    assert calls == [1] * 8
    torch.testing.assert_close(got, per_row_reference(experts, x, ids, weights))


def test_held_experts_compute_their_own_terms_and_sum_to_all() -> None:
    """Expert parallel over 3 ranks (experts [0, 3), [3, 6), [6, 8) of 8): each rank's
    experts compute only their own slots (a row routed to none of them is zero), each active
    held expert once, the others never; the ranks' outputs sum to every expert's."""
    whole = _experts()
    x, ids, weights = _routing(40, 2, 8, seed=7)
    want = whole(x, ids, weights)
    active = set(ids.flatten().tolist())
    total = torch.zeros_like(want)
    for held in (range(0, 3), range(3, 6), range(6, 8)):
        part = copy.deepcopy(whole)
        part.keep(held)
        calls = _count_calls(part)
        got = part(x, ids, weights)
        assert calls == [int(e in active and e in held) for e in range(8)]
        torch.testing.assert_close(got, per_row_reference(part, x, ids, weights))
        elsewhere = ~torch.isin(ids, torch.tensor(list(held))).any(dim=1)
        assert elsewhere.any() and not got[elsewhere].any()
        total += got
    torch.testing.assert_close(total, want)


def test_all_rows_on_one_expert() -> None:
    experts = _experts()
    x, _, weights = _routing(16, 1, 8, seed=6)
    ids = torch.full((16, 1), 5)
    calls = _count_calls(experts)
    got = experts(x, ids, weights)
    assert calls == [0, 0, 0, 0, 0, 1, 0, 0]
    torch.testing.assert_close(got, per_row_reference(experts, x, ids, weights))


# --- DeepSeek-V2 / V3 against transformers --------------------------------------------------

def _deepseek_config(version: int, **overrides: Any) -> Any:
    from transformers import AutoConfig

    base: dict[str, Any] = dict(
        hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=2, num_hidden_layers=3,
        first_k_dense_replace=1, n_group=4, topk_group=2, hidden_act="silu",
    )
    if version == 2:
        base.update(routed_scaling_factor=16.0, topk_method="group_limited_greedy")
    else:
        base.update(routed_scaling_factor=2.5, norm_topk_prob=True)
    return AutoConfig.for_model(f"deepseek_v{version}", **{**base, **overrides})


def _pair(config: Any, version: int) -> tuple[torch.nn.Module, SparseMoE]:
    """transformers' MoE block with perturbed weights, and ours holding the same."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    hf = (DeepseekV2Moe if version == 2 else DeepseekV3MoE)(config).float().eval()
    perturb_parameters(hf, seed=version)
    moe = deepseek_moe(config, version)
    assert moe.sparse_layers == (1, 2)  # first_k_dense_replace = 1
    ours = SparseMoE(_arch(moe)).eval()
    with torch.no_grad():
        ours.gate.weight.copy_(hf.gate.weight)
        if version == 3:  # a buffer in transformers: perturb_parameters leaves it at zero
            bias = torch.randn(config.n_routed_experts, generator=torch.Generator().manual_seed(9))
            hf.gate.e_score_correction_bias.copy_(bias * 0.1)
            ours.gate.e_score_correction_bias.copy_(hf.gate.e_score_correction_bias)
        for e, expert in enumerate(ours.experts):
            expert.gate_up_proj.weight.copy_(hf.experts.gate_up_proj[e])  # gate rows, up rows
            expert.down_proj.weight.copy_(hf.experts.down_proj[e])
        shared = hf.shared_experts
        ours.shared_expert.gate_up_proj.weight.copy_(
            torch.cat([shared.gate_proj.weight, shared.up_proj.weight]))
        ours.shared_expert.down_proj.weight.copy_(shared.down_proj.weight)
    return hf, ours


def _hidden(rows: int) -> torch.Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))


DEEPSEEK_CASES = {
    "v2-greedy": (2, {"topk_method": "greedy"}),
    "v2-group-limited": (2, {}),
    "v3": (3, {}),
    "v3-unnormalised": (3, {"norm_topk_prob": False}),
}


@pytest.mark.parametrize("rows", [1, 7, 96])
@pytest.mark.parametrize("case", list(DEEPSEEK_CASES))
def test_deepseek_moe_equals_transformers(case: str, rows: int) -> None:
    version, overrides = DEEPSEEK_CASES[case]
    hf, ours = _pair(_deepseek_config(version, **overrides), version)
    x = _hidden(rows)
    with torch.no_grad():
        want = hf(x[None])[0]
        got = ours(x)
        _, hf_ids = hf.gate(x)[1:]
        _, our_ids = ours.gate(x)
    assert torch.equal(hf_ids.sort(-1).values, our_ids.sort(-1).values)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [2, 3])
def test_deepseek_grouping_changes_the_choice(version: int) -> None:
    """The group limit (and V3's correction bias) pick other experts than a plain top-k on
    these weights, so the equality above exercises them."""
    config = _deepseek_config(version)
    _, ours = _pair(config, version)
    x = _hidden(96)
    with torch.no_grad():
        grouped = ours.gate(x)[1].sort(-1).values
        plain = torch.topk(ours.gate.weight @ x.T, config.num_experts_per_tok, dim=0).indices
        assert not torch.equal(grouped, plain.T.sort(-1).values)
        if version == 3:
            ours.gate.e_score_correction_bias.zero_()
            assert not torch.equal(grouped, ours.gate(x)[1].sort(-1).values)


# --- quantized experts on the native kernels ------------------------------------------------

@pytest.fixture(scope="module")
def packed_experts(family_dir):
    """``get(method)``: layer 1's experts of the tiny Mixtral quantized by ``method`` for the
    native kernels (built once per method)."""
    from tandem.engine.models.weights import load_model
    from tandem.engine.native import load
    from tandem.engine.quant import quantize_model

    if load() is None:
        pytest.skip("native kernels unavailable here")
    made: dict[str, Experts] = {}

    def get(method: str) -> Experts:
        if method not in made:
            model, _ = load_model(family_dir("mixtral"), torch.float32, torch.device("cpu"),
                                  64, progress=False)
            quantize_model(model, method, packed=True)
            made[method] = model.layers[1].mlp.experts
        return made[method]

    return get


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 200], ids=["one-row", "few-rows", "many-rows"])
def test_quantized_experts_run_the_native_kernels(packed_experts, method: str,
                                                  rows: int) -> None:
    """``--quantization int8/int4`` on the CPU packs every expert for the native kernels; the
    grouped compute then runs one kernel call per active expert over its rows, and equals
    the per-row reference over the dequantized weights (up to the kernels' int16
    activations on few rows)."""
    from tandem.engine.native.packed_linear import PackedLinear

    packed = packed_experts(method)
    assert all(isinstance(lin, PackedLinear)
               for expert in packed for lin in (expert.gate_up_proj, expert.down_proj))
    dequantized = Experts(_arch(), len(packed), packed[0].inter).double()
    with torch.no_grad():
        for ours, expert in zip(dequantized, packed, strict=True):
            ours.gate_up_proj.weight.copy_(expert.gate_up_proj.dequantize())
            ours.down_proj.weight.copy_(expert.down_proj.dequantize())
    x, ids, weights = _routing(rows, 2, len(packed), seed=rows)
    with torch.no_grad():
        got = packed(x, ids, weights).double()
        want = per_row_reference(dequantized, x.double(), ids, weights).double()
    assert ((got - want).norm() / want.norm()).item() < 1e-4


def test_deepseek_routers_stay_fp32_in_a_16_bit_model() -> None:
    """As transformers keeps them: the expert choice of a bf16 DeepSeek model is made on
    fp32 router weights and correction bias; other routers take the model's dtype."""
    v3 = SparseMoE(_arch(deepseek_moe(_deepseek_config(3), 3))).to(torch.bfloat16)
    assert v3.gate.weight.dtype == v3.gate.e_score_correction_bias.dtype == torch.float32
    assert v3.experts[0].gate_up_proj.weight.dtype == torch.bfloat16
    softmax = MoeArch(num_experts=8, top_k=2, expert_intermediate_size=32, sparse_layers=(0,))
    assert SparseMoE(_arch(softmax)).to(torch.bfloat16).gate.weight.dtype == torch.bfloat16
