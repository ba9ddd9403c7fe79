"""Multi-head latent attention over the paged latent cache (tandem/engine/attention/mla.py):
the absorbed decode equals the decompressed attention, and runs the same through the Triton
paged decode (under ``TRITON_INTERPRET=1`` off-GPU) as through torch."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tandem.engine.attention.mla import (  # noqa: E402
    attend_absorbed,
    attend_decompressed,
    decode_rows,
    write_latent,
)
from tandem.engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from tandem.engine.attention.triton_kernels.testing import PagedCase, make_paged_case  # noqa: E402

HEADS, RANK, ROPE, NOPE, VD = 4, 32, 8, 16, 12
SCALE = (NOPE + ROPE) ** -0.5
# (cached, new) per sequence, decodes first; contexts straddle the block size 4
CHUNKS = [(13, 1), (0, 1), (4, 1), (9, 7), (0, 5)]
NUM_DECODES = 3


def _case(device: str = "cpu") -> PagedCase:
    return make_paged_case(CHUNKS, NUM_DECODES, num_q_heads=HEADS, num_kv_heads=1,
                           head_dim=RANK + ROPE, block_size=4, dtype=torch.float32,
                           device=device, seed=3)


def _weights(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    w_uk = torch.randn(HEADS, NOPE, RANK, generator=g) / RANK**0.5
    w_uv = torch.randn(HEADS, VD, RANK, generator=g) / RANK**0.5
    return w_uk.to(device), w_uv.to(device)


def _absorbed(backend, c: PagedCase, q_nope, q_pe, w_uk, w_uv) -> torch.Tensor:
    nd = c.meta.num_decodes
    q = torch.cat((torch.einsum("thn,hnr->thr", q_nope[:nd], w_uk), q_pe[:nd]), dim=-1)
    o_lat = attend_absorbed(backend, q, c.k_cache, decode_rows(c.meta), SCALE, RANK)
    return torch.einsum("thr,hvr->thv", o_lat, w_uv)


def test_absorbed_decode_equals_decompressed_attention() -> None:
    c = _case()
    backend = TorchAttentionBackend()
    write_latent(backend, c.key[:, 0], c.k_cache, c.meta.slot_mapping)
    w_uk, w_uv = _weights()
    g = torch.Generator().manual_seed(2)
    q_nope = torch.randn(c.query.shape[0], HEADS, NOPE, generator=g)
    q_pe = torch.randn(c.query.shape[0], HEADS, ROPE, generator=g)

    def decompress(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lat = rows[:, :RANK]
        k_nope = torch.einsum("sr,hnr->shn", lat, w_uk)
        v = torch.einsum("sr,hvr->shv", lat, w_uv)
        k_pe = rows[:, None, RANK:].expand(-1, HEADS, ROPE)
        return torch.cat((k_nope, k_pe), dim=-1), v

    query = torch.cat((q_nope, q_pe), dim=-1)
    every_row = attend_decompressed(query, c.k_cache, c.meta, 0, SCALE, decompress, VD)
    absorbed = _absorbed(backend, c, q_nope, q_pe, w_uk, w_uv)
    torch.testing.assert_close(absorbed, every_row[:NUM_DECODES], atol=1e-5, rtol=1e-5)
    # the prefill rows alone (first_seq = the first prefill sequence) are the same rows
    prefill = attend_decompressed(query[NUM_DECODES:], c.k_cache, c.meta, NUM_DECODES, SCALE,
                                  decompress, VD)
    torch.testing.assert_close(prefill, every_row[NUM_DECODES:])


def test_triton_absorbed_decode_matches_torch() -> None:
    from tandem.engine.attention.triton_backend import TritonAttentionBackend
    from tandem.engine.attention.triton_kernels.common import is_interpreting

    if not torch.cuda.is_available() and not is_interpreting():
        pytest.skip("no CUDA, and the Triton kernels were imported compiled")
    device = "cpu" if is_interpreting() else "cuda"
    ref, got = _case(), _case(device)
    write_latent(TorchAttentionBackend(), ref.key[:, 0], ref.k_cache, ref.meta.slot_mapping)
    triton = TritonAttentionBackend()
    write_latent(triton, got.key[:, 0], got.k_cache, got.meta.slot_mapping)
    torch.testing.assert_close(got.k_cache.cpu(), ref.k_cache)
    g = torch.Generator().manual_seed(2)
    q_nope = torch.randn(ref.query.shape[0], HEADS, NOPE, generator=g)
    q_pe = torch.randn(ref.query.shape[0], HEADS, ROPE, generator=g)
    want = _absorbed(TorchAttentionBackend(), ref, q_nope, q_pe, *_weights())
    have = _absorbed(triton, got, q_nope.to(device), q_pe.to(device), *_weights(device))
    torch.testing.assert_close(have.cpu(), want, atol=1e-5, rtol=1e-5)


def test_an_mla_engine_on_the_triton_backend_equals_transformers(tiny_dir, make_engine) -> None:
    """The whole model with the latent writes and the absorbed decode through Triton."""
    from tandem.engine import SamplingParams
    from tandem.engine.attention.triton_kernels.common import is_interpreting
    from tests.unit.engine._reference import engine_token_ids, hf_greedy

    if not torch.cuda.is_available() and not is_interpreting():
        pytest.skip("no CUDA, and the Triton kernels were imported compiled")
    path = tiny_dir("deepseek_v3")
    engine = make_engine(model=str(path), num_blocks=64, block_size=4, attention_backend="triton",
                         use_native_kernels=False, device="cpu" if is_interpreting() else "cuda",
                         dtype="float32")
    assert engine.runner.backend.name == "triton"
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (9, 23)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, params), strict=True):
        assert tokens == hf_greedy(path, prompt, 8)
