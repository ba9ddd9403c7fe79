"""The routed experts of one MoE layer, computed expert by expert over grouped rows.

A step's T tokens each pick k experts. Rather than run each token through its experts (k
small matmuls per token, every expert's weights read once per token routed to it), the
``T x k`` (token, expert) slots are sorted by expert, and each *active* expert runs one
matmul over all the rows routed to it: its weights are read once per step, whatever the
batch. Decoding many sequences, an expert serves many rows at the cost of one.

    ids [T, k] --flatten, stable sort--> slots grouped by expert: e0 e0 e0 | e2 | e5 e5 ...
    x[token of slot] --expert e's MLP, one call per group--> y [T*k, hidden]
    out[token] += weight[slot] * y[slot]                    (index_add, in expert order)

Under expert parallelism (tandem/engine/parallel/plan.py) a rank holds a contiguous range
``held`` of the experts; the others are :class:`AbsentExpert` placeholders (no weights, so
their names stay the checkpoint's expert ids). Sorted by expert, the held experts' slots are
one run ``[lo, hi)`` of the sorted slots, so only those rows are gathered and computed; a
token routed to none of them gets zero here (its experts' ranks add theirs in the block's
all-reduce).

The experts are ordinary gated MLPs (tandem/engine/models/layers/mlp.py) of our ``Linear``
layers, so every weight format the dense path loads (float, int8/int4, AWQ/GPTQ/
compressed-tensors, the native kernels' packed layout) serves them unchanged.

On CUDA with Triton importable, float experts (fp32, fp16, bf16) run two grouped-GEMM
launches over every active expert at once instead (moe_triton.py): their weights are held
stacked, ``[E, 2I, H]`` and ``[E, H, I]``, each expert's layers viewing its slice
(:meth:`Experts.stacked`). Quantized experts (int8/int4, pre-quantized checkpoints) keep the
per-expert calls above on CUDA too, each through its layer's own kernel.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.layers.mlp import MLP

# Experts.kernel: "auto" runs the Triton kernels on CUDA where Triton is importable
KERNELS = ("auto", "triton", "torch")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_TRITON = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True, slots=True)
class StackedWeights:
    """Every expert's weights in one tensor each: ``gate_up`` ``[E, 2I, H]`` (each expert's
    gate rows, then its up rows) and ``down`` ``[E, H, I]``."""

    gate_up: torch.Tensor
    down: torch.Tensor


class AbsentExpert(nn.Module):
    """The place of an expert another rank of an expert-parallel group holds: no weights."""


class Experts(nn.ModuleList):
    """``num_experts`` gated MLPs of width ``intermediate_size``, no biases (expert ``e`` is
    ``self[e]``); ``held`` the ones this process holds (all, until :meth:`keep`).

    ``kernel`` picks the compute: ``"auto"`` (the Triton kernels for CUDA inputs where Triton
    is importable and the experts are float, the per-expert torch calls otherwise),
    ``"triton"`` (the kernels wherever the experts are float: on CPU tensors under
    ``TRITON_INTERPRET=1``, for tests), ``"torch"`` (the per-expert calls: the reference)."""

    kernel: str = "auto"

    def __init__(self, arch: ModelArch, num_experts: int, intermediate_size: int) -> None:
        super().__init__(MLP(arch, intermediate_size, bias=False) for _ in range(num_experts))
        self._stack: StackedWeights | None = None
        self._stack_made = False
        self.held = range(num_experts)

    def keep(self, held: range) -> None:
        """Hold experts ``held`` only (one rank's under expert parallelism), an
        :class:`AbsentExpert` in each other's place: done before the weights are loaded."""
        if held.step != 1 or held.start < 0 or held.stop > len(self) or held.start > held.stop:
            raise ValueError(f"held experts {held} are not a range of the {len(self)}")
        for e in range(len(self)):
            if e not in held:
                self[e] = AbsentExpert()
        self.held = held
        self._stack, self._stack_made = None, False

    def stacked(self) -> StackedWeights | None:
        """The experts' weights stacked for the Triton kernels, made on first call: every
        expert's ``gate_up_proj``/``down_proj`` weight becomes a view of its slice, so the
        stack costs no memory beyond one layer's copy while it is made. None where an
        expert's layers are not unbiased float ``nn.Linear`` of one dtype and device (a
        quantized layer). Made after loading, sharding and quantization (at load on CUDA:
        :func:`stack_expert_weights`); an expert layer replaced afterwards is not seen, a
        move (``.to``) drops the stack."""
        if not self._stack_made:
            self._stack = _stack(self)
            self._stack_made = True
        return self._stack

    def triton_weights(self, x: torch.Tensor) -> StackedWeights | None:
        """The stacked weights :meth:`forward` hands the Triton kernels for input ``x``, None
        where the per-expert torch calls serve it (``kernel`` and the rules above; ``x`` of
        another dtype or device than the weights)."""
        if self.kernel not in KERNELS:
            raise ValueError(f"Experts.kernel {self.kernel!r}: one of {KERNELS}")
        if self.kernel == "torch" or (self.kernel == "auto"
                                      and not (x.device.type == "cuda" and _TRITON)):
            return None
        if len(self.held) != len(self):  # expert parallel: the held experts' torch calls
            return None
        stack = self.stacked()
        if stack is None or stack.gate_up.dtype != x.dtype or stack.gate_up.device != x.device:
            return None
        return stack

    def _apply(self, fn: Any, recurse: bool = True) -> Experts:
        """A move or cast (``.to``, ``.cuda``, ``to_empty``) gives each expert's weights
        tensors of their own: the stack is made again on next use."""
        super()._apply(fn, recurse)
        self._stack, self._stack_made = None, False
        return self

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                ) -> torch.Tensor:
        """``x`` ``[T, hidden]``, each token's experts ``ids`` ``[T, k]`` and their ``weights``
        ``[T, k]`` (fp32) -> ``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` ``[T, hidden]``,
        the sum over the held experts only."""
        stack = self.triton_weights(x)
        if stack is not None:
            from tandem.engine.models.layers.moe_triton import fused_experts

            return fused_experts(x, stack.gate_up, stack.down, ids, weights)
        k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, token order within
        counts = torch.bincount(flat, minlength=len(self)).tolist()
        held = self.held
        if len(held) < len(self):  # the held experts' slots: one run of the sorted ones
            lo = sum(counts[:held.start])
            order = order[lo:lo + sum(counts[held.start:held.stop])]
        rows = order // k  # the token of each sorted slot
        xs = x.index_select(0, rows)  # [S, hidden], S = T*k when every expert is held
        ys = torch.empty_like(xs)
        lo = 0
        for e in held:
            n = counts[e]
            if n:
                ys[lo:lo + n] = self[e](xs[lo:lo + n])
                lo += n
        ys = (ys.float() * weights.reshape(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, rows, ys)


def _stack(experts: Experts) -> StackedWeights | None:
    """Stack the experts' float weights and point each expert's layers at its slice (one
    projection at a time: the old tensors go as the new ones come). None under expert
    parallelism (another rank's experts are absent: the held ones' torch calls serve)."""
    if any(isinstance(e, AbsentExpert) for e in experts):
        return None
    pairs = [(e.gate_up_proj, e.down_proj) for e in experts]
    layers = [lin for pair in pairs for lin in pair]
    if not layers or not all(isinstance(lin, nn.Linear) and lin.bias is None for lin in layers):
        return None
    first = layers[0].weight
    if first.dtype not in _FLOATS or any(lin.weight.dtype != first.dtype
                                         or lin.weight.device != first.device
                                         for lin in layers):
        return None
    stacks = []
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, whatever the caller's
        for which in (0, 1):
            stack = torch.stack([pair[which].weight for pair in pairs])
            for e, pair in enumerate(pairs):
                pair[which].weight.data = stack[e]
            stacks.append(stack)
    return StackedWeights(*stacks)


def stack_expert_weights(model: nn.Module) -> int:
    """Stack every float :class:`Experts` of ``model`` now (:meth:`Experts.stacked`) rather
    than at its first step: at load, before the KV cache is sized from the free memory, so the
    transient copy of one layer's experts finds room. Returns the layers stacked."""
    return sum(m.stacked() is not None for m in model.modules() if isinstance(m, Experts))


def per_row_reference(experts: Experts, x: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """What :meth:`Experts.forward` computes, one token and one expert at a time (the
    reference the grouped compute is tested against)."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            if int(ids[t, j]) not in experts.held:
                continue
            y = experts[int(ids[t, j])](x[t:t + 1])[0]
            out[t] += weights[t, j].float() * y.float()
    return out.to(x.dtype)
