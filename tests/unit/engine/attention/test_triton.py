"""Triton paged attention vs the torch reference, under ``TRITON_INTERPRET=1`` off-GPU.

Without CUDA the kernels run in Triton's numpy interpreter on CPU tensors (the env var must be
set before ``triton`` is imported, hence the top of this module); with CUDA they run compiled.
bf16 under the interpreter takes the kernels' fp32-dot path (the interpreter keeps bf16 as raw
uint16 and cannot matmul it), so the bf16 tensor-core path is only checked by the GPU tests.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tandem.engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from tandem.engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from tandem.engine.attention.triton_kernels.common import is_interpreting  # noqa: E402
from tandem.engine.attention.triton_kernels.testing import PagedCase, make_paged_case  # noqa: E402

if not torch.cuda.is_available() and not is_interpreting():
    # A module collected earlier imported the kernels before TRITON_INTERPRET was set.
    pytest.skip(
        "no CUDA, and the Triton kernels were imported compiled (set TRITON_INTERPRET=1)",
        allow_module_level=True,
    )

DEVICE = "cpu" if is_interpreting() else "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # atol = rtol
SCALE = 0.125
# name -> (chunks as (cached, new), num_decodes); lengths straddle the block size 16.
BATCHES = {
    "decodes": ([(40, 1), (4, 1), (15, 1), (16, 1)], 4),
    "prefill": ([(0, 37), (0, 16)], 0),
    "prefill_cached": ([(20, 13), (32, 5), (7, 1)], 0),
    "mixed": ([(33, 1), (0, 1), (12, 21), (48, 9)], 2),
}
HEADS = [(9, 3), (8, 2), (4, 4)]  # (Hq, Hkv): SmolLM2-like GQA, 4:1 GQA, MHA


def case(
    batch: str,
    dtype: torch.dtype = torch.float32,
    heads: tuple[int, int] = (9, 3),
    head_dim: int = 64,
    block_size: int = 16,
    seed: int = 0,
) -> PagedCase:
    chunks, nd = BATCHES[batch]
    return make_paged_case(
        chunks, nd, num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim,
        block_size=block_size, dtype=dtype, device=DEVICE, seed=seed,
    )  # fmt: skip


def check_attend(c: PagedCase, backend: TritonAttentionBackend | None = None) -> None:
    backend = backend or TritonAttentionBackend()
    out = backend.attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE)
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE)
    tol = TOL[c.query.dtype]
    assert out.dtype == c.query.dtype and out.shape == c.query.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("batch", list(BATCHES))
def test_attend_matches_torch(batch: str, heads: tuple[int, int], dtype: torch.dtype) -> None:
    check_attend(case(batch, dtype, heads))


@pytest.mark.parametrize("splits", [2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_split_kv(splits: int, dtype: torch.dtype) -> None:
    """Split-KV decode (partials + reduce) with contexts shorter than some splits' start."""
    c = make_paged_case(
        [(300, 1), (70, 1), (3, 1), (129, 1)], 4, num_q_heads=8, num_kv_heads=2, head_dim=32,
        block_size=16, dtype=dtype, device=DEVICE,
    )  # fmt: skip
    check_attend(c, TritonAttentionBackend(decode_splits=splits))


@pytest.mark.parametrize(
    ("head_dim", "block_size"), [(128, 16), (64, 32), (32, 32), (80, 16), (16, 16)]
)
def test_head_dims_and_block_sizes(head_dim: int, block_size: int) -> None:
    """Powers of two use their own width; 80 is padded to 128 with masked lanes."""
    check_attend(case("mixed", torch.float16, (8, 2), head_dim, block_size))


def test_decode_with_fixed_bound_matches_attend() -> None:
    """The CUDA-graph entry point: bound = block-table width, result unchanged."""
    c = case("decodes", torch.float32, (8, 2))
    m, nd = c.meta, c.meta.num_decodes
    out = TritonAttentionBackend().decode(
        c.query, c.k_cache, c.v_cache, m.block_tables, m.seq_lens, SCALE,
        max_blocks=m.block_tables.shape[1],
    )  # fmt: skip
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, m, SCALE)
    torch.testing.assert_close(out, ref[:nd], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_kv_matches_index_copy(dtype: torch.dtype) -> None:
    c = case("mixed", dtype, (8, 2))
    k_ref, v_ref = c.k_cache.clone(), c.v_cache.clone()
    TorchAttentionBackend().write_kv(c.key, c.value, k_ref, v_ref, c.meta.slot_mapping)
    TritonAttentionBackend().write_kv(c.key, c.value, c.k_cache, c.v_cache, c.meta.slot_mapping)
    assert torch.equal(c.k_cache, k_ref) and torch.equal(c.v_cache, v_ref)


def test_write_kv_skips_negative_slots_and_casts() -> None:
    """Padded rows (slot -1) write nothing; fp32 rows land in a bf16 cache rounded."""
    c = case("mixed", torch.bfloat16, (4, 4))
    key, value = c.key.float(), c.value.float()
    slots = c.meta.slot_mapping.clone()
    slots[::3] = -1
    keep = slots >= 0
    k_ref, v_ref = c.k_cache.clone(), c.v_cache.clone()
    TorchAttentionBackend().write_kv(key[keep], value[keep], k_ref, v_ref, slots[keep])
    TritonAttentionBackend().write_kv(key, value, c.k_cache, c.v_cache, slots)
    assert torch.equal(c.k_cache, k_ref) and torch.equal(c.v_cache, v_ref)


def test_write_then_attend_end_to_end() -> None:
    """A step as the model runs it: write the new K/V, then attend over them."""
    c = case("mixed", torch.float16, (9, 3))
    tri, ref = TritonAttentionBackend(), TorchAttentionBackend()
    k_ref, v_ref = c.k_cache.clone(), c.v_cache.clone()
    ref.write_kv(c.key, c.value, k_ref, v_ref, c.meta.slot_mapping)
    tri.write_kv(c.key, c.value, c.k_cache, c.v_cache, c.meta.slot_mapping)
    out = tri.attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE)
    expected = ref.attend(c.query, k_ref, v_ref, c.meta, SCALE)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_random_sweep(seed: int) -> None:
    """Random mixes of decodes and chunks over dtypes, GQA ratios, head dims, block sizes."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options: list) -> object:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    def rand(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=gen))

    nd, npf = rand(0, 5), rand(0 if seed else 1, 4)
    chunks = [(rand(0, 200), 1) for _ in range(nd)] + [
        (pick([0, rand(1, 150)]), rand(1, 90)) for _ in range(npf)
    ]
    if not chunks:
        chunks, nd = [(10, 1)], 1
    hq, hkv = pick([(9, 3), (8, 2), (6, 6), (16, 1)])
    c = make_paged_case(
        chunks, nd, num_q_heads=hq, num_kv_heads=hkv, head_dim=pick([32, 64, 128, 96]),
        block_size=pick([16, 32]), dtype=pick(DTYPES), device=DEVICE, seed=seed,
    )  # fmt: skip
    check_attend(c, TritonAttentionBackend(decode_splits=pick([None, 1, 3])))


# name -> (chunks, num_decodes, window): windows shorter than, equal to and longer than the
# contexts, across block boundaries; freed blocks read NaN (make_paged_case).
WINDOW_BATCHES = {
    "decodes": ([(40, 1), (4, 1), (15, 1), (16, 1), (100, 1)], 5, 16),
    "decodes_odd": ([(70, 1), (33, 1), (6, 1)], 3, 23),
    "prefill": ([(0, 37), (0, 16)], 0, 10),
    "prefill_cached": ([(20, 13), (32, 5), (90, 40)], 0, 17),
    "mixed": ([(33, 1), (0, 1), (12, 21), (48, 9)], 2, 32),
    "wide": ([(33, 1), (12, 21)], 1, 4096),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)], ids=lambda h: f"hq{h[0]}-hkv{h[1]}")
@pytest.mark.parametrize("batch", list(WINDOW_BATCHES))
def test_sliding_window_matches_torch(batch: str, heads: tuple[int, int],
                                      dtype: torch.dtype) -> None:
    """Sliding-window decode and prefill against the torch reference; neither reads a block
    before the window (those hold NaN here)."""
    chunks, nd, window = WINDOW_BATCHES[batch]
    c = make_paged_case(
        chunks, nd, num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=32, block_size=16,
        dtype=dtype, device=DEVICE, window=window,
    )  # fmt: skip
    out = TritonAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE, window)
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE, window)
    assert not ref.isnan().any() and not out.isnan().any()
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("splits", [2, 5])
def test_sliding_window_decode_split_kv(splits: int) -> None:
    """Split-KV decode over a window: the splits cover the window, none reads before it."""
    c = make_paged_case(
        [(300, 1), (70, 1), (3, 1), (129, 1)], 4, num_q_heads=8, num_kv_heads=2, head_dim=32,
        block_size=16, dtype=torch.float32, device=DEVICE, window=100,
    )  # fmt: skip
    out = TritonAttentionBackend(decode_splits=splits).attend(
        c.query, c.k_cache, c.v_cache, c.meta, SCALE, 100)
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE, 100)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", ["decodes", "mixed"])
def test_fp8_cache_through_triton_matches_torch(batch: str) -> None:
    """The fp8 KV wrapper (tandem/engine/quant/kv_fp8.py) over the Triton kernels equals it
    over the torch reference: the same e4m3 blocks, dequantized with the same scales."""
    from tandem.engine.quant.kv_fp8 import Fp8KVBackend, Fp8Scales, quantize_fp8

    c = case(batch, torch.float32, (8, 2))
    scales = Fp8Scales(k=0.5, v=0.25)
    k_scale, v_scale = scales.layer(0)
    k8, v8 = quantize_fp8(c.k_cache, k_scale), quantize_fp8(c.v_cache, v_scale)
    out = Fp8KVBackend(TritonAttentionBackend(), scales).attend(c.query, k8, v8, c.meta, SCALE)
    ref = Fp8KVBackend(TorchAttentionBackend(), scales).attend(c.query, k8, v8, c.meta, SCALE)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
