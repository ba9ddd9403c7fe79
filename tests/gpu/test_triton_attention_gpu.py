"""Triton paged attention vs the torch reference on CUDA, bf16, at serving sizes.

Shapes: SmolLM2-135M (Hq=9, Hkv=3, D=64) and Llama-3-8B (Hq=32, Hkv=8, D=128); batches of 64
decodes over 1k-4k contexts, 2k-token prefills with and without a cached prefix, and a mix.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Collected before tests/unit: import the kernels the way the CPU unit tests need them.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tandem.engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from tandem.engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from tandem.engine.attention.triton_kernels.testing import PagedCase, make_paged_case  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MODELS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # Hq, Hkv, D
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # atol = rtol
SCALE_OF = {64: 64**-0.5, 128: 128**-0.5}


def decode_chunks(batch: int, lo: int, hi: int, seed: int = 0) -> list[tuple[int, int]]:
    """``batch`` decodes whose cached lengths are uniform in [lo, hi)."""
    gen = torch.Generator().manual_seed(seed)
    return [(int(c), 1) for c in torch.randint(lo, hi, (batch,), generator=gen)]


def build(
    model: str,
    chunks: list[tuple[int, int]],
    nd: int,
    dtype: torch.dtype = torch.bfloat16,
    block_size: int = 16,
) -> PagedCase:
    hq, hkv, d = MODELS[model]
    return make_paged_case(
        chunks, nd, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=block_size,
        dtype=dtype, device="cuda",
    )  # fmt: skip


def check(c: PagedCase, backend: TritonAttentionBackend | None = None) -> None:
    scale = SCALE_OF[c.query.shape[-1]]
    out = (backend or TritonAttentionBackend()).attend(c.query, c.k_cache, c.v_cache, c.meta, scale)
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, scale)
    tol = TOL[c.query.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("model", list(MODELS))
def test_decode_batch64(model: str, block_size: int) -> None:
    check(build(model, decode_chunks(64, 1024, 4096), 64, block_size=block_size))


@pytest.mark.parametrize("splits", [1, 4, 16])
def test_decode_split_kv_small_batch(splits: int) -> None:
    c = build("llama8b", decode_chunks(4, 100, 4096), 4)
    check(c, TritonAttentionBackend(decode_splits=splits))


@pytest.mark.parametrize("cached", [0, 1000])
@pytest.mark.parametrize("model", list(MODELS))
def test_prefill_2k(model: str, cached: int) -> None:
    check(build(model, [(cached, 2048)], 0))


@pytest.mark.parametrize("model", list(MODELS))
def test_mixed_step(model: str) -> None:
    chunks = decode_chunks(32, 1, 3000) + [(0, 512), (700, 333), (2047, 1), (16, 16)]
    check(build(model, chunks, 32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_other_dtypes(dtype: torch.dtype) -> None:
    check(build("llama8b", decode_chunks(8, 1, 2000) + [(300, 700)], 8, dtype=dtype))


def test_write_kv_matches_index_copy() -> None:
    c = build("llama8b", decode_chunks(64, 1, 4096) + [(0, 2048)], 64)
    k_ref, v_ref = c.k_cache.clone(), c.v_cache.clone()
    TorchAttentionBackend().write_kv(c.key, c.value, k_ref, v_ref, c.meta.slot_mapping)
    TritonAttentionBackend().write_kv(c.key, c.value, c.k_cache, c.v_cache, c.meta.slot_mapping)
    assert torch.equal(c.k_cache, k_ref) and torch.equal(c.v_cache, v_ref)


def test_decode_replays_in_cuda_graph() -> None:
    """Captured once with the table-width bound, replayed after the lengths change in place."""
    c = build("smollm2", decode_chunks(16, 1, 2000), 16)
    m, scale, tri = c.meta, SCALE_OF[64], TritonAttentionBackend()
    out = torch.empty_like(c.query)
    bound = m.block_tables.shape[1]

    def run() -> None:
        tri.decode(c.query, c.k_cache, c.v_cache, m.block_tables, m.seq_lens, scale, bound, out)

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    new_lens = [max(1, s // 2) for s in m.seq_lens_cpu]
    m.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    m.seq_lens_cpu[:] = new_lens
    graph.replay()
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, m, scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("splits", [None, 1, 8])
def test_sliding_window_mistral_shapes(splits: int | None) -> None:
    """Mistral-7B's heads (Hq=32, Hkv=8, D=128), window 4096: decodes over 1k-8k contexts,
    a prefill chunk past the window and one within it; the blocks behind each sequence's
    window hold NaN (freed), so reading one shows."""
    chunks = decode_chunks(16, 1000, 8000) + [(5000, 1024), (100, 900)]
    c = make_paged_case(chunks, 16, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
                        dtype=torch.bfloat16, device="cuda", window=4096)
    backend = TritonAttentionBackend(decode_splits=splits)
    out = backend.attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE_OF[128], 4096)
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, c.meta, SCALE_OF[128], 4096)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_sliding_window_decode_replays_in_cuda_graph() -> None:
    """The windowed decode captured with the table-width bound, replayed at other lengths."""
    c = make_paged_case(decode_chunks(8, 200, 3000), 8, num_q_heads=9, num_kv_heads=3,
                        head_dim=64, block_size=16, dtype=torch.bfloat16, device="cuda",
                        window=512)
    m, scale, tri = c.meta, SCALE_OF[64], TritonAttentionBackend()
    out = torch.empty_like(c.query)
    bound = m.block_tables.shape[1]

    def run() -> None:
        tri.decode(c.query, c.k_cache, c.v_cache, m.block_tables, m.seq_lens, scale, bound, out,
                   window=512)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    # longer contexts (within each table's spare block): their windows move on
    new_lens = [s + 9 for s in m.seq_lens_cpu]
    assert max(new_lens) <= bound * 16
    m.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    m.seq_lens_cpu[:] = new_lens
    graph.replay()
    ref = TorchAttentionBackend().attend(c.query, c.k_cache, c.v_cache, m, scale, 512)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
