"""Triton weight-only int8 / int4 matmuls for CUDA: weights dequantized in registers.

    y[M, N] = x[M, K] @ W[N, K]^T,   W = q * scale[n]                         (int8)
                                     W = (q - 8) * scale[n, k // G] + zero[n, k // G]   (int4)

One program computes a ``BLOCK_M x BLOCK_N`` tile of ``y``, walking K in ``BLOCK_K`` steps.
int4 weights are ``[N, K/2]`` bytes, even k in the low nibble: a K tile loads each byte twice
(once per nibble) rather than interleaving, which keeps the kernel short; L1 serves the
second load. Accumulation is fp32; ``y`` has ``x``'s dtype. Simple on purpose: decode rows
are few, so the kernel is bandwidth-bound and reading 1 (int8) or 0.5 (int4) bytes per
weight instead of 2 is the whole gain. Runs under ``TRITON_INTERPRET=1`` on CPU for tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _quant_matmul_kernel(
    x_ptr,  # [M, K]
    q_ptr,  # int8 [N, K] or uint8 [N, K/2]
    scale_ptr,  # fp32 [N] (int8) or [N, K/G] (int4)
    zero_ptr,  # fp32 [N, K/G] (int4; unused for int8)
    y_ptr,  # [M, N]
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_ym,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :], other=0.0,
        ).to(tl.float32)  # [BM, BK]
        wmask = mask_n[:, None] & mask_k[None, :]
        if INT4:
            byte = tl.load(q_ptr + offs_n[:, None] * stride_qn + offs_k[None, :] // 2,
                           mask=wmask, other=0).to(tl.int32)
            q = (byte >> ((offs_k[None, :] % 2) * 4)) & 0xF  # [BN, BK]
            g = offs_k[None, :] // GROUP
            s = tl.load(scale_ptr + offs_n[:, None] * stride_sn + g, mask=wmask, other=0.0)
            z = tl.load(zero_ptr + offs_n[:, None] * stride_sn + g, mask=wmask, other=0.0)
            w = (q.to(tl.float32) - 8.0) * s + z
        else:
            q = tl.load(q_ptr + offs_n[:, None] * stride_qn + offs_k[None, :],
                        mask=wmask, other=0)
            w = q.to(tl.float32)  # the per-channel scale is applied once, after the loop
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if not INT4:
        s = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
        acc = acc * s[None, :]
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y,
             mask=mask_m[:, None] & mask_n[None, :])


def _launch(x, q, scale, zero, k: int, group: int, int4: bool) -> torch.Tensor:
    x2 = x.reshape(-1, k).contiguous()
    m, n = x2.shape[0], q.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _quant_matmul_kernel[grid](
        x2, q, scale, zero, y, m, n, k,
        x2.stride(0), q.stride(0), scale.stride(0) if int4 else 0, y.stride(0),
        GROUP=group, INT4=int4, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return y.view(*x.shape[:-1], n)


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (qweight * scale[:, None])^T`` for int8 ``qweight`` ``[N, K]``."""
    return _launch(x, qweight, scale, scale, qweight.shape[1], 1, False)


def int4_matmul(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int
) -> torch.Tensor:
    """``x @ dequant(qweight)^T`` for nibble-packed ``qweight`` ``[N, K/2]`` (see int4.py)."""
    return _launch(x, qweight, scale, zero, qweight.shape[1] * 2, group, True)
