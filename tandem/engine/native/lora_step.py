"""LoRA adapters laid out for the fused native forward (``lora_delta.h``), and a step's slots.

    LoraAdapter.weights[(layer, group)]  A [n r, in] stacked, B [out, n r] block-diagonal
        ──> one LoraProj per (layer, group), fp32:
              a    A as it is                      [n r, in]
              bt   each sub-projection's B^T       [r, out_1] [r, out_2] ...   (scaling in B)
              subs bit j: sub-projection j moves the output (a zero block is skipped)
    NativeAdapter    an adapter's table [num_layers x 4] (qkv, o, gate_up, down), made once
    NativeLoras.step(adapters, row_slots) -> NativeLoraStep   the table of each slot (the
                     manager's slots: tandem/engine/lora/manager.py) and each row's slot

The C side groups rows by slot and runs, per projection and slot, a shrink and an expand GEMM
over that slot's rows (punica's SGMV in two loops), so only a row's own adapter is multiplied.
The block-diagonal B of a fused projection is stored per sub-projection (B_q^T, B_k^T, B_v^T
side by side): an expand touches only its sub-projection's columns, and one the adapter does
not target costs nothing. The weights are widened to fp32 from the adapter's stored tensors (a
bf16 model's adapter: its bf16 values), as the kernels widen a 16-bit model's own weights.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tandem.engine.lora.adapter import GROUPS, LoraAdapter, module_dims
from tandem.engine.models.arch import ModelArch

_F = ctypes.POINTER(ctypes.c_float)
_GROUP_INDEX = {group: i for i, group in enumerate(GROUPS)}  # lora_delta.h's LORA_PROJS order
MAX_RANK = 512  # lora_delta.h's LORA_MAX_RANK (LoraConfig bounds --max-lora-rank to it)


class LoraProjStruct(ctypes.Structure):
    """``tnd::LoraProj``: one adapter's delta on one fused projection of one layer."""

    _fields_ = [("a", _F), ("bt", _F), ("rank", ctypes.c_int32), ("subs", ctypes.c_int32)]


class LoraStepStruct(ctypes.Structure):
    """``tnd::LoraStep``: a step's slots and each row's slot (-1: the base model)."""

    _fields_ = [("num_slots", ctypes.c_int32), ("slots", ctypes.c_void_p),
                ("row_slot", ctypes.c_void_p)]


class NativeAdapter:
    """One adapter's table of LoraProj, ``[num_layers * 4]`` (holds the tensors it points at)."""

    def __init__(self, adapter: LoraAdapter, arch: ModelArch) -> None:
        if adapter.rank > MAX_RANK:
            raise ValueError(f"LoRA rank {adapter.rank} is above the kernels' {MAX_RANK}")
        self.identity = adapter.identity
        dims = module_dims(arch)
        r = adapter.rank
        self.table = (LoraProjStruct * (arch.num_layers * len(GROUPS)))()
        self._keep: list[torch.Tensor] = []
        for (layer, group), (a, b) in adapter.weights.items():
            a32 = a.detach().to("cpu", torch.float32).contiguous()  # [n r, in]
            b32 = b.detach().to("cpu", torch.float32)  # [out, n r], block-diagonal
            parts, subs, row = [], 0, 0
            for j, sub in enumerate(GROUPS[group]):
                width = dims[sub][1]
                block = b32[row:row + width, j * r:(j + 1) * r]  # [out_j, r]
                if block.any() and a32[j * r:(j + 1) * r].any():
                    subs |= 1 << j
                parts.append(block.T.reshape(-1))  # [r, out_j] row-major
                row += width
            bt = torch.cat(parts).contiguous()
            self._keep += [a32, bt]
            self.table[layer * len(GROUPS) + _GROUP_INDEX[group]] = LoraProjStruct(
                ctypes.cast(a32.data_ptr(), _F), ctypes.cast(bt.data_ptr(), _F), r, subs)


@dataclass(frozen=True, slots=True)
class NativeLoraStep:
    """What ``FusedForward`` hands the C side for one step (keeps its arrays alive)."""

    struct: LoraStepStruct
    rows: int  # the step's rows, each with its slot
    keep: tuple[object, ...]


class NativeLoras:
    """The native tables of the adapters steps carry, made on an adapter's first step and
    dropped once it is no longer loaded (an adapter reloaded under its name is another
    identity: its table is made anew)."""

    def __init__(self, arch: ModelArch) -> None:
        self.arch = arch
        self._tables: dict[str, NativeAdapter] = {}

    def step(self, adapters: Sequence[LoraAdapter], row_slots: Sequence[int],
             loaded: Iterable[LoraAdapter]) -> NativeLoraStep:
        """The step's description: slot ``i`` is ``adapters[i]``, row ``t`` runs under slot
        ``row_slots[t]`` (-1: the base model); ``loaded``: every adapter still registered."""
        live = {a.identity for a in loaded}
        for identity in [i for i in self._tables if i not in live]:
            del self._tables[identity]
        tables = []
        for adapter in adapters:
            native = self._tables.get(adapter.identity)
            if native is None:
                native = self._tables[adapter.identity] = NativeAdapter(adapter, self.arch)
            tables.append(native)
        slots = (ctypes.c_void_p * max(1, len(tables)))(
            *[ctypes.addressof(t.table) for t in tables])
        rows = torch.tensor(list(row_slots), dtype=torch.int32)
        struct = LoraStepStruct(len(tables), ctypes.addressof(slots), rows.data_ptr())
        return NativeLoraStep(struct, len(rows), (slots, rows, *tables))
