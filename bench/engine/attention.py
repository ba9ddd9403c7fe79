"""Time the Triton paged-attention kernels against the torch backend (CUDA only).

    python -m bench.engine.attention

For SmolLM2-135M (Hq=9, Hkv=3, D=64) and Llama-3-8B (Hq=32, Hkv=8, D=128) shapes in bf16 with
16-token blocks it prints, per case, the median time of each backend (``triton.testing.do_bench``),
the decode bandwidth (K/V bytes read / time), the prefill throughput (causal FLOPs / time), the
speedup over torch and the max abs difference between the two outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.engine.attention.triton_backend import TritonAttentionBackend
from tandem.engine.attention.triton_kernels.testing import PagedCase, make_paged_case

MODELS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # Hq, Hkv, D
BLOCK_SIZE = 16
DTYPE = torch.bfloat16
# name -> (chunks as (cached, new), num_decodes)
CASES: dict[str, tuple[list[tuple[int, int]], int]] = {
    "decode 64 x 1k": ([(1023, 1)] * 64, 64),
    "decode 64 x 4k": ([(4095, 1)] * 64, 64),
    "decode 64 x 1k-4k": ([(1024 + 48 * i, 1) for i in range(64)], 64),
    "decode 8 x 4k": ([(4095, 1)] * 8, 8),
    "prefill 2k": ([(0, 2048)], 0),
    "prefill 2k after 2k": ([(2048, 2048)], 0),
    "prefill 4 x 512": ([(0, 512)] * 4, 0),
}


def kv_bytes(c: PagedCase) -> int:
    """Bytes of K and V a decode step must read: every cached position once per kv head."""
    _, _, hkv, d = c.k_cache.shape
    return 2 * sum(c.meta.seq_lens_cpu) * hkv * d * c.k_cache.element_size()


def causal_flops(c: PagedCase) -> int:
    """QK^T and PV multiply-adds over the visible (causal) keys of every query row."""
    hq, d = c.query.shape[1], c.query.shape[2]
    visible = 0
    for ql, sl in zip(c.meta.query_lens_cpu, c.meta.seq_lens_cpu, strict=True):
        cached = sl - ql
        visible += ql * cached + ql * (ql + 1) // 2  # row i sees cached + i + 1 keys
    return 4 * hq * d * visible


def time_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` on the GPU."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run_case(model: str, name: str) -> str:
    """Time one case on both backends and format its row."""
    hq, hkv, d = MODELS[model]
    chunks, nd = CASES[name]
    c = make_paged_case(
        chunks, nd, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=BLOCK_SIZE,
        dtype=DTYPE, device="cuda",
    )  # fmt: skip
    scale = d**-0.5
    tri, ref = TritonAttentionBackend(), TorchAttentionBackend()

    def run_tri() -> torch.Tensor:
        return tri.attend(c.query, c.k_cache, c.v_cache, c.meta, scale)

    def run_ref() -> torch.Tensor:
        return ref.attend(c.query, c.k_cache, c.v_cache, c.meta, scale)

    diff = (run_tri().float() - run_ref().float()).abs().max().item()
    t_tri, t_ref = time_ms(run_tri), time_ms(run_ref)
    if nd:
        rate = f"{kv_bytes(c) / t_tri / 1e6:8.1f} GB/s"
    else:
        rate = f"{causal_flops(c) / t_tri / 1e9:8.1f} TFLOP/s"
    return (
        f"{model:8s} {name:20s} triton {t_tri:8.3f} ms  torch {t_ref:8.3f} ms  "
        f"{rate:>16s}  x{t_ref / t_tri:6.2f}  max|diff| {diff:.1e}"
    )


def main() -> None:
    """Run every case for every model shape and print one line each."""
    if not torch.cuda.is_available():
        sys.exit("bench.engine.attention needs a CUDA GPU (the Triton kernels are GPU kernels).")
    print(f"{torch.cuda.get_device_name()}  dtype={DTYPE}  block_size={BLOCK_SIZE}")
    for model in MODELS:
        for name in CASES:
            print(run_case(model, name), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
