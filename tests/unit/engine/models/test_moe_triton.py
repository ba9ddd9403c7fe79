"""The Triton grouped-GEMM experts (moe_triton.py) against the torch path's per-expert calls,
under ``TRITON_INTERPRET=1`` off-GPU.

Without CUDA the kernels run in Triton's numpy interpreter on CPU tensors (the env var must be
set before ``triton`` is imported, hence the top of this module); with CUDA they run compiled
and the tests are gpu-marked. 1, few and many rows per expert, top-k 1/2/8, idle experts,
sizes that are no multiple of the tiles (masking) and span several tiles, fp32/fp16/bf16; and
whole MoE blocks of every routing (softmax, DeepSeek-V2's and V3's, shared experts) with the
experts on the kernels against the same block on the torch path.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="Triton (and its CPU interpreter) is not installed")

from tandem.engine.models.arch import ModelArch, MoeArch  # noqa: E402
from tandem.engine.models.layers import SparseMoE  # noqa: E402
from tandem.engine.models.layers.moe_experts import Experts, stack_expert_weights  # noqa: E402
from tandem.engine.models.layers.moe_triton import _INTERPRETED, fused_experts  # noqa: E402
from tandem.engine.testing.perturb import perturb_parameters  # noqa: E402

if not torch.cuda.is_available() and not _INTERPRETED:
    # A module collected earlier imported the kernels before TRITON_INTERPRET was set.
    pytest.skip("no CUDA, and the Triton MoE kernels were imported compiled "
                "(set TRITON_INTERPRET=1)", allow_module_level=True)

DEVICE = torch.device("cpu" if _INTERPRETED else "cuda")
pytestmark = [] if _INTERPRETED else [pytest.mark.gpu]
# relative error (Frobenius) against the fp32 torch path over the same rounded weights
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
HIDDEN, INTER = 99, 71  # neither a multiple of the 64-wide tiles; both span two


def _arch(hidden: int, moe: MoeArch | None = None) -> ModelArch:
    return ModelArch(model_type="test", vocab_size=256, hidden_size=hidden,
                     intermediate_size=2 * hidden, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     max_position_embeddings=256, eos_token_ids=(2,), moe=moe)


def _experts(num_experts: int, dtype: torch.dtype, seed: int = 0) -> Experts:
    experts = Experts(_arch(HIDDEN), num_experts, INTER)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return experts.to(DEVICE, dtype)


def _routing(rows: int, k: int, num_experts: int, seed: int,
             pool: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``, each row's ``k`` distinct experts (drawn from ``pool``), fp32 weights."""
    g = torch.Generator().manual_seed(seed)
    pool_t = torch.tensor(pool if pool is not None else list(range(num_experts)))
    ids = torch.stack([pool_t[torch.randperm(len(pool_t), generator=g)[:k]]
                       for _ in range(rows)])
    weights = torch.rand(rows, k, generator=g)
    return torch.randn(rows, HIDDEN, generator=g), ids, weights


def _compare(experts: Experts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
             ) -> None:
    """The kernels (through ``Experts.forward``) against the torch path in fp32 over the
    same (rounded) weights."""
    dtype = experts[0].gate_up_proj.weight.dtype
    reference = Experts(_arch(HIDDEN), len(experts), INTER)
    with torch.no_grad():
        for p, q in zip(reference.parameters(), experts.parameters(), strict=True):
            p.copy_(q.float().cpu())
    reference.kernel = "torch"
    x = x.to(dtype)
    want = reference(x.float(), ids, weights)
    experts.kernel = "triton"
    assert experts.triton_weights(x.to(DEVICE)) is not None
    with torch.no_grad():
        got = experts(x.to(DEVICE), ids.to(DEVICE), weights.to(DEVICE))
    assert got.dtype == dtype and got.shape == want.shape
    rel = ((got.float().cpu() - want).norm() / want.norm()).item()
    assert rel < TOL[dtype], rel


@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("rows", [1, 3, 200], ids=["one-row", "few-rows", "many-rows"])
def test_kernels_equal_the_torch_path(rows: int, k: int) -> None:
    experts = _experts(16, torch.float32, seed=rows + k)
    _compare(experts, *_routing(rows, k, 16, seed=rows * 10 + k))


def test_idle_experts_and_one_busy_expert() -> None:
    """Rows on experts 3, 7 and 12 of 16 only (the first and last idle), then every row on
    one expert (many blocks of it)."""
    experts = _experts(16, torch.float32, seed=1)
    _compare(experts, *_routing(40, 2, 16, seed=2, pool=[3, 7, 12]))
    _compare(experts, *_routing(150, 1, 16, seed=3, pool=[15]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(dtype: torch.dtype) -> None:
    experts = _experts(8, dtype, seed=4)
    _compare(experts, *_routing(37, 2, 8, seed=5))


def test_the_stack_is_the_experts_weights() -> None:
    """The stacked weights the kernels read are the experts' own (views, no copy), and the
    per-expert torch path still reads them; a move makes them anew."""
    experts = _experts(4, torch.float32, seed=6)
    stack = experts.stacked()
    assert stack is not None
    for e, expert in enumerate(experts):
        assert expert.gate_up_proj.weight.data_ptr() == stack.gate_up[e].data_ptr()
        assert expert.down_proj.weight.data_ptr() == stack.down[e].data_ptr()
    x, ids, weights = _routing(5, 2, 4, seed=7)
    x, ids, weights = x.to(DEVICE), ids.to(DEVICE), weights.to(DEVICE)
    with torch.no_grad():
        direct = fused_experts(x, stack.gate_up, stack.down, ids, weights)
        experts.kernel = "torch"
        torch.testing.assert_close(direct, experts(x, ids, weights), rtol=1e-5, atol=1e-5)
    experts.to(torch.float64)  # fp64: no kernel takes it, the torch path serves it
    assert experts.stacked() is None
    experts.kernel = "triton"
    assert experts.triton_weights(x.double()) is None


def test_quantized_experts_keep_the_torch_path() -> None:
    """An int8 expert layer (its own CUDA kernel) leaves the block off the Triton kernels:
    nothing is stacked at load, and the per-expert calls serve it (forward not run here:
    torch's CPU int8 kernel takes no in_features of 71)."""
    from tandem.engine.quant.int8 import Int8Linear

    block = SparseMoE(_arch(HIDDEN, BLOCKS["mixtral"]))
    perturb_parameters(block, seed=9)
    block.experts[2].down_proj = Int8Linear.from_float(block.experts[2].down_proj.weight)
    assert stack_expert_weights(block) == 0
    block.experts.kernel = "triton"
    assert block.experts.triton_weights(torch.zeros(1, HIDDEN)) is None
    plain = SparseMoE(_arch(HIDDEN, BLOCKS["mixtral"]))
    assert stack_expert_weights(plain) == 1


def test_no_rows() -> None:
    experts = _experts(4, torch.float32)
    stack = experts.stacked()
    assert stack is not None
    empty = torch.zeros(0, HIDDEN, device=DEVICE)
    out = fused_experts(empty, stack.gate_up, stack.down,
                        torch.zeros(0, 2, dtype=torch.int64, device=DEVICE),
                        torch.zeros(0, 2, device=DEVICE))
    assert out.shape == (0, HIDDEN)


# --- whole MoE blocks: every routing, shared experts ----------------------------------------

BLOCKS = {
    "mixtral": MoeArch(num_experts=8, top_k=2, expert_intermediate_size=INTER,
                       sparse_layers=(0,)),
    "qwen2-moe": MoeArch(num_experts=8, top_k=4, expert_intermediate_size=INTER,
                         sparse_layers=(0,), norm_topk_prob=False,
                         shared_intermediate_size=2 * INTER, shared_expert_gate=True),
    "deepseek-v2": MoeArch(num_experts=16, top_k=4, expert_intermediate_size=INTER,
                           sparse_layers=(0,), routing="deepseek_v2",
                           topk_method="group_limited_greedy", n_group=4, topk_group=2,
                           routed_scaling_factor=16.0, shared_intermediate_size=2 * INTER),
    "deepseek-v3": MoeArch(num_experts=16, top_k=8, expert_intermediate_size=INTER,
                           sparse_layers=(0,), routing="deepseek_v3", n_group=4,
                           topk_group=2, routed_scaling_factor=2.5,
                           shared_intermediate_size=INTER),
}


@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_moe_block_on_the_kernels_equals_the_torch_path(name: str, rows: int) -> None:
    block = SparseMoE(_arch(HIDDEN, BLOCKS[name]))
    perturb_parameters(block, seed=8)  # V3's correction bias included
    block = block.to(DEVICE).eval()
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    with torch.no_grad():
        block.experts.kernel = "torch"
        want = block(x)
        block.experts.kernel = "triton"
        assert block.experts.triton_weights(x) is not None
        got = block(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
