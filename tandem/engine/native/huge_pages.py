"""Move a CPU model's weights into one buffer backed by transparent huge pages.

A decode step streams every weight once (92 MiB for SmolLM2's Q4_1/Q8_0 blocks). In 4 KiB
pages that is ~23,000 TLB misses a step; in 2 MiB pages, 46. Measured on the 2-core EPYC
box: a single-row step 8.3 ms instead of 9.7 (bench/engine/native_rows.py). Linux grants huge pages
to an ``madvise(MADV_HUGEPAGE)`` mapping when it can (``enabled`` = ``madvise`` or
``always``); when it cannot, this is an ordinary copy and nothing else changes.

    gather(model)        every PackedLinear buffer and fp32 linear weight -> views of one
                         2 MiB-aligned anonymous mapping (advised before it is first touched)
    zeros(shape, dtype)  a zeroed tensor in such a mapping (the paged KV cache: a step reads
                         blocks all over it)
"""

from __future__ import annotations

import logging
import mmap

import torch
from torch import nn

from tandem.engine.native.packed_linear import PackedLinear

log = logging.getLogger(__name__)

HUGE = 2 << 20
_ALIGN = 64


def _slots(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    """(module, attribute, tensor) of every weight the native forward streams."""
    out: list[tuple[nn.Module, str, torch.Tensor]] = []
    seen: set[int] = set()
    for module in model.modules():
        names = ("q", "d", "m", "bias") if isinstance(module, PackedLinear) else \
            ("weight",) if isinstance(module, nn.Linear) else ()
        for name in names:
            t = getattr(module, name, None)
            if t is None or t.device.type != "cpu":
                continue
            key = t.untyped_storage().data_ptr()
            if key in seen:  # a tied weight: moved once (the second slot is re-pointed below)
                continue
            seen.add(key)
            out.append((module, name, t))
    return out


def _mapping(nbytes: int) -> torch.Tensor:
    """``nbytes`` (rounded up to 2 MiB) of zeroed anonymous memory, advised for huge pages
    before anything touches it, as a uint8 tensor (which keeps the mapping alive)."""
    length = (nbytes + HUGE - 1) // HUGE * HUGE
    buf = mmap.mmap(-1, length + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE  # the first 2 MiB boundary inside the mapping
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, start, length)
        except OSError as exc:  # not supported here: plain pages, same contents
            log.info("no huge pages: %s", exc)
    return raw[start:start + length]


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype)`` in a huge-page mapping (CPU)."""
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE:
        return torch.zeros(shape, dtype=dtype)
    return _mapping(nbytes)[:nbytes].view(dtype).view(shape)


def gather(model: nn.Module) -> int:
    """Move the weights into a huge-page buffer; returns the bytes backed by huge pages
    afterwards (0 when the kernel granted none)."""
    slots = _slots(model)
    sizes = [(t.numel() * t.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN for _, _, t in slots]
    total = sum(sizes)
    if total < HUGE:
        return 0
    arena = _mapping(total)
    moved: dict[int, torch.Tensor] = {}
    off = 0
    for (module, name, t), size in zip(slots, sizes, strict=True):
        n = t.numel() * t.element_size()
        view = arena[off:off + n].view(t.dtype).view(t.shape)
        view.copy_(t.detach())
        moved[t.untyped_storage().data_ptr()] = view
        _assign(module, name, view)
        off += size
    for module in model.modules():  # tied weights: point every holder at the moved copy
        for name in ("q", "d", "m", "bias", "weight"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in moved and \
                    t.data_ptr() != moved[t.untyped_storage().data_ptr()].data_ptr():
                _assign(module, name, moved[t.untyped_storage().data_ptr()])
    huge = _huge_bytes()
    log.info("weights in one %.0f MiB mapping, %.0f MiB of this process in huge pages",
             total / 2**20, huge / 2**20)
    return huge


def _assign(module: nn.Module, name: str, t: torch.Tensor) -> None:
    if isinstance(getattr(module, name), nn.Parameter):
        setattr(module, name, nn.Parameter(t, requires_grad=False))
    else:
        setattr(module, name, t)


def _huge_bytes() -> int:
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
