"""Mixture-of-experts layers on the fused native CPU forward (moe_experts.h) against the torch
forward (tandem/engine/models/layers/moe*.py) on the same weights.

Tiny perturbed checkpoints (every router, expert, shared expert, its gate, bias and norm away
from transformers' initialisation): Mixtral (renormalised top 2 of 8), Qwen2-MoE (a shared
expert behind its sigmoid gate, a dense layer between sparse ones) and Qwen3-MoE
(``norm_topk_prob``, every second layer dense). Each case runs one multi-sequence prefill
and decode steps of 1, 6 and 40 rows, and checks from the torch routers' choices that the
steps cover an expert with 1 row, with a few (2..7: the few-row loops) and with many (8 or
more: the tiled GEMM, ``TILED_MIN_ROWS``).

Tolerance (relative, on the logits): with fp32 weights the two paths differ in summation
order only (measured <= 6e-7): 1e-5. With int8 experts the torch reference multiplies by the
exact fp32 dequantized weights (``exact_torch_path``) and the kernels' few-row loops round
activations to int16 per group of 32 (~2e-5 per linear; measured <= 5e-5 over a step): 5e-4.
Either leaves an order of magnitude; a routing error is far above both (one layer's top-k
weights left unnormalised moves Mixtral's logits by 0.3, top 1 instead of 2 by 0.5). Greedy
tokens must be equal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.models.layers import SparseMoE
from tandem.engine.native import load, unsupported_reason
from tandem.engine.testing import make_tiny_checkpoint
from tests.unit.engine._reference import engine_token_ids
from tests.unit.engine.native._torch_steps import rel_err, torch_logits

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

TILED_MIN_ROWS = 8  # gemm_tiled.h: an expert with this many rows takes the tiled GEMM
# name -> (arch, make_tiny_checkpoint options)
CASES = {
    "mixtral": ("mixtral", {}),
    "qwen2-moe": ("qwen2_moe", {"num_layers": 3, "mlp_only_layers": [1]}),
    "qwen3-moe": ("qwen3_moe", {"num_layers": 3, "norm_topk_prob": True,
                                "decoder_sparse_step": 2}),
}
SEQS = 40


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``moe_dir(case)``: the checkpoint of one of CASES, written once per module."""
    made: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in made:
            arch, options = CASES[case]
            made[case] = make_tiny_checkpoint(tmp_path_factory.mktemp(case), arch=arch,
                                              **options)
        return made[case]

    return get


def _with_busiest_expert(runner, forward) -> tuple[torch.Tensor, int]:  # noqa: ANN001
    """``forward()`` (a torch forward of ``runner``'s model) and the rows it routed to its
    busiest expert, over the sparse layers."""
    most: list[int] = []

    def hook(module, _inputs, out) -> None:  # noqa: ANN001
        most.append(int(torch.bincount(out[1].flatten(), minlength=module.moe.num_experts).max()))

    mlps = [layer.mlp for layer in runner.model.layers if isinstance(layer.mlp, SparseMoE)]
    handles = [mlp.gate.register_forward_hook(hook) for mlp in mlps]
    try:
        out = forward()
    finally:
        for h in handles:
            h.remove()
    assert len(most) == len(mlps)
    return out, max(most)


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("case", list(CASES))
def test_moe_forward_matches_torch(make_engine, moe_dir, exact_torch_path, case: str,
                                   quant: str) -> None:
    engine = make_engine(model=str(moe_dir(case)), dtype="float32",
                         quantization=quant, num_blocks=128, block_size=4)
    runner = engine.runner
    assert runner.fused is not None, unsupported_reason(runner.model)
    tol = 1e-5 if quant == "none" else 5e-4
    g = torch.Generator().manual_seed(2)
    lengths = [3 + i % 6 for i in range(SEQS)]  # 3..8 tokens, 3 blocks each
    tables = [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(SEQS)]
    kv_ref, kv_nat = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)

    def step(ids: list[int], positions: list[int], seq: list[int]) -> int:
        ref, busiest = _with_busiest_expert(
            runner, lambda: torch_logits(runner, ids, positions, seq, tables, kv_ref))
        nat = runner.fused(ids, positions, seq, tables, kv_nat, range(len(ids)))
        assert rel_err(nat, ref) < tol, (case, quant, len(ids), rel_err(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), (case, quant, len(ids))
        return busiest

    # every sequence's prompt in one prefill step (many rows per expert)
    prompt = [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]
    busiest = step([t for p in prompt for t in p],
                   [i for n in lengths for i in range(n)],
                   [s for s, n in enumerate(lengths) for _ in range(n)])
    assert busiest >= TILED_MIN_ROWS
    # decode steps of 1, 6 and 40 sequences: one row, a few and many rows per expert
    cover = ((1, range(1, 2)), (6, range(2, TILED_MIN_ROWS)),
             (SEQS, range(TILED_MIN_ROWS, SEQS + 1)))
    for n, want in cover:
        seqs = list(range(n))
        ids = torch.randint(3, 256, (n,), generator=g).tolist()
        busiest = step(ids, [lengths[s] for s in seqs], seqs)
        assert busiest in want, (n, busiest)
        for s in seqs:
            lengths[s] += 1
    assert rel_err(kv_nat, kv_ref) < tol


@pytest.mark.parametrize("case", ["mixtral", "qwen2-moe"])
def test_engine_greedy_native_equals_exact_torch(make_engine, moe_dir, exact_torch_path,
                                                 case: str) -> None:
    """Whole engine runs, int4 experts (chunked prefill and batched decodes on the fused
    path) give the torch path's greedy tokens."""
    path = str(moe_dir(case))
    outs = []
    for native in (True, False):
        engine = make_engine(model=path, dtype="float32", quantization="int4", num_blocks=64,
                             block_size=16, max_num_batched_tokens=64,
                             use_native_kernels=native)
        assert (engine.runner.fused is not None) == native
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 90, 17, 33)]
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        outs.append(engine_token_ids(engine, prompts, params))  # make_engine checks the blocks
    assert outs[0] == outs[1]

