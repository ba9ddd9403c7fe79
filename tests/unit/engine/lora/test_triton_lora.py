"""The Triton LoRA shrink/expand kernels vs the torch reference delta, under
``TRITON_INTERPRET=1`` off-GPU.

Without CUDA the kernels run in Triton's numpy interpreter on CPU tensors (the env var must be
set before ``triton`` is imported, hence the top of this module); with CUDA they run compiled.
Random adapters in the engine's fused layout (stacked A, scaled block-diagonal B), mixed
ranks, some without a projection, rows of several slots and of none, interleaved.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tandem.engine.lora import LoraConfig  # noqa: E402
from tandem.engine.lora.adapter import GROUPS, LoraAdapter  # noqa: E402
from tandem.engine.lora.batch import LoraBatch, stack  # noqa: E402
from tandem.engine.lora.triton_lora import (  # noqa: E402
    _INTERPRETED,
    GroupShapes,
    Segments,
    TritonLoraBatch,
    column_bounds,
    lora_shrink,
    stack_padded,
)
from tandem.engine.testing.lora import greedy_under_adapters, write_random_adapter  # noqa: E402

if not torch.cuda.is_available() and not _INTERPRETED:
    # A module collected earlier imported the kernels before TRITON_INTERPRET was set.
    pytest.skip("no CUDA, and the Triton LoRA kernels were imported compiled "
                "(set TRITON_INTERPRET=1)", allow_module_level=True)

DEVICE = torch.device("cpu" if _INTERPRETED else "cuda")
# With CUDA the kernel checks run compiled and are gpu-marked, so scripts/gpu_check.sh (which
# runs ``-m gpu``) takes them; without it they run interpreted with the unit tests.
pytestmark = [] if _INTERPRETED else [pytest.mark.gpu]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# tiny dims with GQA-like unequal sub-projections: q 24, k/v 8; gate/up 40
HIDDEN, Q, KV, INTER = 20, 24, 8, 40
SHAPES: GroupShapes = {"qkv_proj": (HIDDEN, (Q, KV, KV)), "o_proj": (Q, (HIDDEN,)),
                       "gate_up_proj": (HIDDEN, (INTER, INTER)), "down_proj": (INTER, (HIDDEN,))}
DIMS = {g: (fan_in, sum(w)) for g, (fan_in, w) in SHAPES.items()}


def _adapter(name: str, rank: int, groups: tuple[str, ...], seed: int,
             dtype: torch.dtype) -> LoraAdapter:
    """A random adapter in the engine's layout (one layer), B block-diagonal."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for group in groups:
        fan_in, widths = SHAPES[group]
        a = torch.randn(len(widths) * rank, fan_in, generator=g)
        b = torch.zeros(sum(widths), len(widths) * rank)
        row = 0
        for j, w in enumerate(widths):
            b[row:row + w, j * rank:(j + 1) * rank] = torch.randn(w, rank, generator=g) * 0.3
            row += w
        weights[(0, group)] = (a.to(DEVICE, dtype), b.to(DEVICE, dtype))
    return LoraAdapter(name, f"/{name}", rank, name * 4, weights)


def _adapters(dtype: torch.dtype) -> list[LoraAdapter]:
    every = tuple(GROUPS)
    return [_adapter("a", 8, every, 1, dtype),
            _adapter("b", 4, ("qkv_proj", "down_proj"), 2, dtype),
            _adapter("c", 16, ("qkv_proj", "o_proj", "gate_up_proj"), 3, dtype)]


ROWS = {  # row slots (-1: the base model)
    "mixed": [0, -1, 1, 1, 2, -1, 0, 2, 2, 1, -1, 0, 0, 0, 2, 1, 0],
    "one_each": [2, 0, 1],
    "no_adapter_rows": [-1, -1, -1],
    "one_slot_long": [1] * 37 + [-1] * 3,  # a segment over several row blocks
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("group", list(GROUPS))
def test_delta_matches_torch_reference(group: str, rows: str, dtype: torch.dtype) -> None:
    adapters = _adapters(dtype)
    row_slots = ROWS[rows]
    fan_in, widths = SHAPES[group]
    g = torch.Generator().manual_seed(len(row_slots))
    x = torch.randn(len(row_slots), fan_in, generator=g).to(DEVICE, dtype)
    y0 = torch.randn(len(row_slots), sum(widths), generator=g).to(DEVICE, dtype)

    ref = y0.clone()
    LoraBatch.build(adapters, row_slots, stack(adapters, 1, DIMS), dtype, DEVICE) \
        .add_delta(ref, x, 0, group)
    got = y0.clone()
    TritonLoraBatch.build(row_slots, len(adapters), stack_padded(adapters, 1, SHAPES),
                          column_bounds(SHAPES, DEVICE), DEVICE).add_delta(got, x, 0, group)

    # atol scaled to the output: the kernels keep t in fp32 where the reference rounds it to
    # the dtype, so fp16/bf16 outputs may differ by an ulp of the largest values
    tol = TOL[dtype]
    atol = tol * max(1.0, ref.float().abs().max().item())
    torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=tol)
    base = [i for i, s in enumerate(row_slots) if s < 0]
    assert torch.equal(got[base], y0[base])  # rows of no adapter untouched, bit for bit
    moved = [i for i, s in enumerate(row_slots) if s >= 0 and (0, group) in adapters[s].weights]
    if moved:  # the comparison can fail: these rows' deltas are not zero
        assert not torch.allclose(got[moved].float(), y0[moved].float())


def test_shrink_pads_smaller_ranks_with_zeros() -> None:
    """Slot 1 (rank 4) in a step padded to rank 16: its padded columns of t are exactly 0,
    its real ones are x @ A^T."""
    adapters = _adapters(torch.float32)
    stacks = stack_padded(adapters, 1, SHAPES)
    a_pad, _ = stacks[(0, "qkv_proj")]
    assert a_pad.shape == (3, 3 * 16, HIDDEN)
    row_slots = [1, 0, 1]
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    t = lora_shrink(x, a_pad, Segments.build(row_slots, 3, DEVICE))
    a_b = adapters[1].weights[(0, "qkv_proj")][0]  # [3 * 4, HIDDEN]
    for row in (0, 2):
        for j in range(3):
            torch.testing.assert_close(t[row, j * 16:j * 16 + 4],
                                       x[row] @ a_b[j * 4:(j + 1) * 4].T, atol=1e-5, rtol=1e-5)
            assert torch.all(t[row, j * 16 + 4:(j + 1) * 16] == 0)


def test_segments_group_rows_by_slot() -> None:
    seg = Segments.build([0, -1, 1, 1, -1, 0, 2], 3, torch.device("cpu"))
    assert seg.order.tolist() == [0, 5, 2, 3, 6]
    assert seg.starts.tolist() == [0, 2, 4] and seg.lens.tolist() == [2, 2, 1]
    assert seg.max_len == 2


@pytest.mark.skipif(not _INTERPRETED, reason="CPU engine on interpreted kernels (CUDA: "
                    "tests/gpu/test_lora_gpu.py)")
def test_manager_on_triton_kernels_equals_torch_path(make_engine, tiny_dir, tmp_path) -> None:
    """The engine's torch forward with the manager switched to the (interpreted) Triton
    deltas: the same greedy tokens as with the torch gather-matmul, base rows mixed in."""
    base = tiny_dir("llama", 2)
    dirs = {"a": write_random_adapter(base, tmp_path / "a", 8, 1),
            "b": write_random_adapter(base, tmp_path / "b", 4, 2, ("q_proj", "v_proj",
                                                                   "down_proj"))}
    kw = dict(model=str(base), num_blocks=64, block_size=16, use_native_kernels=False,
              lora=LoraConfig(enabled=True, modules=tuple((n, str(p)) for n, p in dirs.items()),
                              max_loras=2, max_lora_rank=8))
    tri, ref = make_engine(**kw), make_engine(**kw)
    assert not tri.loras.use_triton  # CPU: the torch reference unless switched
    tri.loras.use_triton = True
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 30, (4,), generator=g)]
    jobs = [(p, n, 4) for p, n in zip(prompts, ["a", "", "b", "a"], strict=True)]
    got = greedy_under_adapters(tri, jobs)
    assert got == greedy_under_adapters(ref, jobs)
    plain = greedy_under_adapters(ref, [(p, "", m) for p, _, m in jobs])
    assert [g != p for g, p in zip(got, plain, strict=True)] == [True, False, True, True]
