"""The routed experts of a MoE layer on CUDA: two Triton grouped-GEMM launches per layer.

    ids [T, k] --align_by_expert (moe_align.py)--> slots sorted by expert, padded to BLOCK_M
    gate_up:  h[s]   = silu(x[s // k] @ Wg[e]^T) * (x[s // k] @ Wu[e]^T)   W13 [E, 2I, H]
    down:     y[s]   = weight[s] * (h[s] @ W2[e]^T)                        W2  [E, H, I]
    out[t]  = sum_j y[t k + j]                                             (a torch sum over k)

Program (m, n) of either kernel takes row block m, all of one expert ``e`` (the block's
expert), and column block n of the output: each active expert's weight tiles are read once
per row block, whatever the batch, and an expert without rows gets no program. Rows are
gathered from ``x`` through the slot order (no copy of ``x`` per slot), and each slot's rows
of ``h`` and ``y`` are written at the slot's own index, so the sum over ``k`` needs no
un-permuting. SiLU-and-mul is fused into the gate_up kernel (two accumulators, gate and up
columns of the same expert), so the ``2I``-wide intermediate is never written. Accumulation
is fp32; ``h`` and ``y`` are rounded to the model's dtype, as the torch path rounds its
matmuls' outputs; the routing weight (fp32) multiplies the fp32 accumulator.

Float weights only (fp32, fp16, bf16), held stacked (``Experts.stacked``,
tandem/engine/models/layers/moe_experts.py): quantized experts keep the torch path's
per-expert calls (their layers' own CUDA kernels). The grid is sized from host values only
(``max_blocks``), so a step makes no host sync here. Under ``TRITON_INTERPRET=1`` (set before
this module is imported) the kernels run in Triton's numpy interpreter on CPU tensors: the
tests' way to check them without a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tandem.engine.models.layers.moe_align import ExpertBlocks, align_by_expert

# Read once, as ``triton.jit`` reads it when it decorates the kernels below.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
_BLOCK_N = 64
_BLOCK_K = 64


def block_rows(num_slots: int, num_experts: int) -> int:
    """Rows per block: small where each expert serves few rows (decode: less padding),
    larger where many (prefill: fewer weight reads per row)."""
    per_expert = num_slots / max(num_experts, 1)
    return 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64


def _fp32_dot(dtype: torch.dtype) -> bool:
    """Whether the kernels upcast to fp32 before ``tl.dot`` (then IEEE, no TF32): fp32, and
    bf16 under the interpreter (which keeps bf16 as raw uint16 and cannot matmul it); fp16
    and bf16 otherwise run on tensor cores with fp32 accumulation."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and _INTERPRETED)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, slots_ptr, experts_ptr, num_slots, num_experts,
                    top_k, K, N, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
                    stride_hm, stride_hn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(experts_ptr + pid_m)
    if expert >= num_experts:  # a spare block past the last used one
        return
    slot = tl.load(slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = slot < num_slots
    token = (slot // top_k).to(tl.int64)  # row * stride may pass 2^31 on long prefills
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_base = w_ptr + expert.to(tl.int64) * stride_we  # a layer's experts may pass 2^31
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + token[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & n_mask[None, :]
        w_offs = offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
        wg = tl.load(w_base + w_offs, mask=w_mask, other=0.0)  # gate rows n
        wu = tl.load(w_base + N * stride_wn + w_offs, mask=w_mask, other=0.0)  # up rows N + n
        if FP32_DOT:
            x32 = x.to(tl.float32)
            acc_gate += tl.dot(x32, wg.to(tl.float32), input_precision="ieee")
            acc_up += tl.dot(x32, wu.to(tl.float32), input_precision="ieee")
        else:
            acc_gate += tl.dot(x, wg)
            acc_up += tl.dot(x, wu)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up  # silu(gate) * up
    tl.store(h_ptr + slot.to(tl.int64)[:, None] * stride_hm + offs_n[None, :] * stride_hn,
             h.to(h_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, route_ptr, slots_ptr, experts_ptr, num_slots,
                 num_experts, K, N, stride_hm, stride_hk, stride_we, stride_wn, stride_wk,
                 stride_ym, stride_yn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FP32_DOT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(experts_ptr + pid_m)
    if expert >= num_experts:
        return
    slot = tl.load(slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = slot < num_slots
    row = slot.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        h = tl.load(h_ptr + row[:, None] * stride_hm + offs_k[None, :] * stride_hk,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if FP32_DOT:
            acc += tl.dot(h.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(h, w)
    route = tl.load(route_ptr + row, mask=m_mask, other=0.0)  # fp32 routing weight
    acc = acc * route[:, None]
    tl.store(y_ptr + row[:, None] * stride_ym + offs_n[None, :] * stride_yn,
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gate_up_silu(x: torch.Tensor, w13: torch.Tensor, blocks: ExpertBlocks, top_k: int
                 ) -> torch.Tensor:
    """``h`` ``[T k, I]``: each slot's ``silu(x Wg^T) * (x Wu^T)`` under its expert's
    ``w13`` (``[E, 2I, H]``: gate rows, then up rows), in ``x``'s dtype."""
    inter = w13.shape[1] // 2
    h = torch.empty(blocks.num_slots, inter, dtype=x.dtype, device=x.device)
    grid = (blocks.num_blocks, triton.cdiv(inter, _BLOCK_N))
    _gate_up_kernel[grid](
        x, w13, h, blocks.slots, blocks.experts, blocks.num_slots, blocks.num_experts, top_k,
        x.shape[1], inter, x.stride(0), x.stride(1), w13.stride(0), w13.stride(1),
        w13.stride(2), h.stride(0), h.stride(1),
        BLOCK_M=blocks.block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K,
        FP32_DOT=_fp32_dot(x.dtype),
    )  # fmt: skip
    return h


def down_weighted(h: torch.Tensor, w2: torch.Tensor, route: torch.Tensor,
                  blocks: ExpertBlocks) -> torch.Tensor:
    """``y`` ``[T k, H]``: each slot's ``route[s] * (h[s] W2[e]^T)`` (``w2``: ``[E, H, I]``,
    ``route``: fp32 ``[T k]``), in ``h``'s dtype."""
    hidden = w2.shape[1]
    y = torch.empty(blocks.num_slots, hidden, dtype=h.dtype, device=h.device)
    grid = (blocks.num_blocks, triton.cdiv(hidden, _BLOCK_N))
    _down_kernel[grid](
        h, w2, y, route, blocks.slots, blocks.experts, blocks.num_slots, blocks.num_experts,
        h.shape[1], hidden, h.stride(0), h.stride(1), w2.stride(0), w2.stride(1),
        w2.stride(2), y.stride(0), y.stride(1),
        BLOCK_M=blocks.block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K,
        FP32_DOT=_fp32_dot(h.dtype),
    )  # fmt: skip
    return y


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H]``, each token's experts ``ids`` ``[T, k]`` and their ``weights``
    ``[T, k]`` -> ``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` ``[T, H]`` in ``x``'s
    dtype, for gated-SiLU experts stacked as ``w13`` ``[E, 2I, H]`` and ``w2`` ``[E, H, I]``
    (all three of one dtype)."""
    t, k = ids.shape
    if t == 0:
        return torch.zeros_like(x)
    num_experts = w13.shape[0]
    blocks = align_by_expert(ids, num_experts, block_rows(t * k, num_experts))
    h = gate_up_silu(x, w13, blocks, k)
    y = down_weighted(h, w2, weights.reshape(-1).float().contiguous(), blocks)
    if k == 1:
        return y
    return y.view(t, k, -1).sum(dim=1)  # fp32 accumulation inside torch's sum
