"""Byte-level access to the blocks of one worker's cache tensor.

``kv: [num_layers, planes, num_blocks, block_size, num_kv_heads, head_dim]``, contiguous
(planes: K and V, or one latent plane: tandem/kv_transfer/layout.py). A payload covering
layers ``[lo, hi)`` and block ids ``ids`` is ``kv[lo:hi, :, ids]`` in C order:

    for l in lo..hi-1:  for k in planes:  for b in ids:  kv[l, k, b]   (block_bytes each)

On a CPU cache the views point straight into the tensor's memory (adjacent ids coalesced into
one run), so the sender's ``sendmsg`` reads and the receiver's ``recvmsg_into`` writes the cache
itself. A CUDA cache (or ``staged=True``, which tests use to exercise the same path on CPU) goes
through one host buffer per frame: gather with ``index_select`` before sending, scatter with
``index_copy_`` after receiving.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tandem.kv_transfer.errors import TransferSpecError
from tandem.kv_transfer.layout import KvLayout

# A contiguous byte buffer: sendmsg, recvmsg_into and xxhash take either. Block views are numpy
# uint8 slices rather than memoryviews because numpy arrays are not tracked by the garbage
# collector: thousands of memoryview slices per frame trigger full collections over the whole
# heap (torch's objects included) and made building the views ~10x slower.
Buffer = np.ndarray | memoryview

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8,
}


def coalesce(ids: Sequence[int]) -> list[tuple[int, int]]:
    """Runs of consecutive ascending ids as ``(start, count)``, order kept: [3,4,5,9] -> [(3,3),(9,1)]."""
    runs: list[tuple[int, int]] = []
    for b in ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def check_cache_tensor(kv: torch.Tensor, layout: KvLayout) -> None:
    """Raise ``TransferSpecError`` unless ``kv`` has the layout's shape, dtype and is contiguous."""
    want = TORCH_DTYPES[layout.kv_dtype]
    if kv.dtype != want:
        raise TransferSpecError(f"cache dtype {kv.dtype} != layout kv_dtype {layout.kv_dtype}")
    shape = tuple(kv.shape)
    expect = (layout.num_layers, layout.planes, shape[2] if len(shape) == 6 else -1,
              layout.block_size,
              layout.num_kv_heads, layout.row_width)
    if len(shape) != 6 or shape != expect:
        raise TransferSpecError(f"cache shape {shape} does not match layout {expect}")
    if not kv.is_contiguous():
        raise TransferSpecError("cache tensor must be contiguous")


class KvBlocks:
    """One worker's cache, addressed as (layer range, block ids) spans of bytes."""

    __slots__ = ("kv", "layout", "num_blocks", "staged", "_bytes")

    def __init__(self, kv: torch.Tensor, layout: KvLayout, *, staged: bool | None = None) -> None:
        check_cache_tensor(kv, layout)
        self.kv = kv
        self.layout = layout
        self.num_blocks = int(kv.shape[2])
        self.staged = kv.device.type != "cpu" if staged is None else staged
        # [L * planes * N * block_bytes] bytes aliasing the tensor (CPU only).
        self._bytes = kv.view(torch.uint8).reshape(-1).numpy() if kv.device.type == "cpu" else None

    @property
    def is_cuda(self) -> bool:
        """True when the cache lives on a CUDA device."""
        return self.kv.device.type == "cuda"

    def check_span(self, lo: int, hi: int, ids: Sequence[int]) -> None:
        """Raise ``TransferSpecError`` unless layers and ids address this cache."""
        if not 0 <= lo < hi <= self.layout.num_layers:
            raise TransferSpecError(f"layer range [{lo}, {hi}) outside 0..{self.layout.num_layers}")
        if not ids:
            raise TransferSpecError("empty block id list")
        if min(ids) < 0 or max(ids) >= self.num_blocks:
            raise TransferSpecError(f"block ids outside 0..{self.num_blocks - 1}")
        if len(set(ids)) != len(ids):
            raise TransferSpecError("duplicate block ids")

    def nbytes(self, lo: int, hi: int, count: int) -> int:
        """Payload bytes for ``count`` blocks over layers ``[lo, hi)``."""
        return self.layout.payload_bytes(hi - lo, count)

    def direct_views(self, lo: int, hi: int, ids: Sequence[int]) -> list[Buffer]:
        """Views into the cache itself, in payload order (CPU caches only)."""
        assert self._bytes is not None, "direct views need a CPU cache"
        bb = self.layout.block_bytes
        n = self.num_blocks
        runs = coalesce(ids)
        # Byte offset of run (start, count) in layer l, plane k: ((l * P + k) * n + start) * bb.
        spans = [(start * bb, count * bb) for start, count in runs]
        data = self._bytes
        out: list[Buffer] = []
        planes = self.layout.planes
        for half in range(lo * planes, hi * planes):
            base = half * n * bb
            out += [data[base + a:base + a + size] for a, size in spans]
        return out

    def _index(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.long, device=self.kv.device)

    def gather(self, lo: int, hi: int, ids: Sequence[int]) -> torch.Tensor:
        """A host copy of ``kv[lo:hi, :, ids]`` (the staged send path)."""
        out = self.kv[lo:hi].index_select(2, self._index(ids))
        if out.device.type != "cpu":
            out = out.to("cpu", non_blocking=False)
        return out.contiguous()

    def staging(self, lo: int, hi: int, count: int) -> torch.Tensor:
        """An empty host buffer shaped like a payload (the staged receive path)."""
        shape = self.layout.payload_shape(hi - lo, count)
        pin = self.is_cuda and torch.cuda.is_available()
        return torch.empty(shape, dtype=self.kv.dtype, pin_memory=pin)

    def _rows(self, lo: int, hi: int, ids: Sequence[int]) -> np.ndarray:
        """Row numbers, in payload order, of the blocks in ``kv`` viewed as
        ``[num_layers * planes * num_blocks, block_bytes]``: row = (layer * P + k) * N + id."""
        planes = self.layout.planes
        halves = np.arange(lo * planes, hi * planes, dtype=np.int64)[:, None] * self.num_blocks
        return (halves + np.asarray(ids, dtype=np.int64)[None, :]).reshape(-1)

    def gather_into(self, lo: int, hi: int, ids: Sequence[int], out: np.ndarray) -> None:
        """Copy ``kv[lo:hi, :, ids]`` into the flat uint8 host array ``out`` in one C loop (the
        shm sender; zero-copy is impossible there)."""
        bb = self.layout.block_bytes
        rows_out = out.reshape(-1, bb)
        if self._bytes is not None:
            # mode="wrap" skips numpy's buffered bounds checking; ids are checked already.
            np.take(self._bytes.reshape(-1, bb), self._rows(lo, hi, ids), axis=0, out=rows_out,
                    mode="wrap")
        else:
            gathered = self.gather(lo, hi, ids)
            rows_out[...] = tensor_bytes(gathered).reshape(-1, bb)

    def scatter_from(self, lo: int, hi: int, ids: Sequence[int], src: np.ndarray) -> None:
        """Copy the flat uint8 host array ``src`` into ``kv[lo:hi, :, ids]`` in one C loop."""
        bb = self.layout.block_bytes
        if self._bytes is not None:
            self._bytes.reshape(-1, bb)[self._rows(lo, hi, ids)] = src.reshape(-1, bb)
        else:
            shape = self.layout.payload_shape(hi - lo, len(ids))
            host = torch.from_numpy(src).view(self.kv.dtype).view(shape)
            self.scatter(lo, hi, ids, host)

    def scatter(self, lo: int, hi: int, ids: Sequence[int], host: torch.Tensor) -> None:
        """Write a received host payload into ``kv[lo:hi, :, ids]``; on CUDA the copy has
        finished when this returns, so a ``release`` after it cannot race a write in flight."""
        src = host.to(self.kv.device, non_blocking=False)
        self.kv[lo:hi].index_copy_(2, self._index(ids), src)
        if self.is_cuda:
            torch.cuda.current_stream(self.kv.device).synchronize()


def tensor_bytes(t: torch.Tensor) -> Buffer:
    """A flat byte view of a contiguous CPU tensor (any dtype, bf16 included)."""
    return t.view(torch.uint8).reshape(-1).numpy()


class SendSpan:
    """What one KV frame sends: source layers and block ids, as byte views."""

    __slots__ = ("blocks", "lo", "hi", "ids", "nbytes", "_host")

    def __init__(self, blocks: KvBlocks, lo: int, hi: int, ids: Sequence[int]) -> None:
        self.blocks, self.lo, self.hi, self.ids = blocks, lo, hi, list(ids)
        self.nbytes = blocks.nbytes(lo, hi, len(self.ids))
        self._host: torch.Tensor | None = None

    def views(self) -> list[Buffer]:
        """Source bytes in payload order (gathers into a host buffer when staged)."""
        if not self.blocks.staged:
            return self.blocks.direct_views(self.lo, self.hi, self.ids)
        self._host = self.blocks.gather(self.lo, self.hi, self.ids)
        return [tensor_bytes(self._host)]

    def release(self) -> None:
        """Drop the staging buffer, if any."""
        self._host = None


class RecvSpan:
    """Where one KV frame lands: destination layers and block ids, as byte views."""

    __slots__ = ("blocks", "lo", "hi", "ids", "nbytes", "_host")

    def __init__(self, blocks: KvBlocks, lo: int, hi: int, ids: Sequence[int]) -> None:
        self.blocks, self.lo, self.hi, self.ids = blocks, lo, hi, list(ids)
        self.nbytes = blocks.nbytes(lo, hi, len(self.ids))
        self._host: torch.Tensor | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of staging memory this span holds right now."""
        return 0 if self._host is None else self.nbytes

    def views(self) -> list[Buffer]:
        """Destination bytes in payload order (a host buffer when staged)."""
        if not self.blocks.staged:
            return self.blocks.direct_views(self.lo, self.hi, self.ids)
        self._host = self.blocks.staging(self.lo, self.hi, len(self.ids))
        return [tensor_bytes(self._host)]

    def finish(self) -> None:
        """Land a staged payload in the cache (no-op for direct views)."""
        if self._host is not None:
            self.blocks.scatter(self.lo, self.hi, self.ids, self._host)

    def release(self) -> None:
        """Drop the staging buffer, if any."""
        self._host = None
