"""Byte-level access to the blocks of one worker's cache tensor.

``kv: [num_layers, planes, num_blocks, block_size, num_kv_heads, row_width]``, contiguous
(planes: K and V, or one latent plane: tandem/kv_transfer/layout.py). A payload covering
layers ``[lo, hi)`` and block ids ``ids`` is ``kv[lo:hi, :, ids]`` in C order:

    for l in lo..hi-1:  for k in planes:  for b in ids:  kv[l, k, b]   (block_bytes each)

Viewed as rows of ``block_bytes`` (``[num_layers * planes * num_blocks, block_bytes]``), a payload
is a list of row numbers, so a CPU cache is gathered and scattered one chunk of rows at a time
with one numpy call each (``SendSpan.chunks``, ``RecvSpan.land``): a fragmented cache moves
through a contiguous staging chunk at memory speed, with no per-block Python. A CUDA cache
(or ``staged=True``, which tests use to exercise the same path on CPU) goes through one host
buffer per frame: gathered with ``index_select`` before sending, scattered with
``index_copy_`` after receiving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

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
    "int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn,
}


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
    """One worker's cache, addressed as (layer range, block ids) spans of bytes.

    ``window()`` gives the same cache restricted to a range of its KV heads (one route of a
    re-sharded handoff, tandem/kv_transfer/reshard.py): its layout states the window's heads,
    and its payloads, gathered and scattered through the staged path, hold only them."""

    __slots__ = ("kv", "layout", "num_blocks", "staged", "heads", "_bytes", "_row")

    def __init__(self, kv: torch.Tensor, layout: KvLayout, *, staged: bool | None = None) -> None:
        check_cache_tensor(kv, layout)
        self.kv = kv
        self.layout = layout
        self.num_blocks = int(kv.shape[2])
        self.staged = kv.device.type != "cpu" if staged is None else staged
        self.heads: tuple[int, int] | None = None  # a window's [start, stop) of kv's heads
        # [L * planes * N * block_bytes] bytes aliasing the tensor (CPU only).
        self._bytes = kv.view(torch.uint8).reshape(-1).numpy() if kv.device.type == "cpu" else None
        self._row = row_dtype(layout.block_bytes)

    def window(self, start: int, stop: int) -> KvBlocks:
        """This cache's KV heads ``[start, stop)`` alone (staged: a head range is strided
        inside each block, so it moves through a host copy). TransferSpecError when the range
        is not within the cache's heads."""
        if self.heads is not None or not 0 <= start < stop <= self.layout.num_kv_heads:
            raise TransferSpecError(f"head window [{start}, {stop}) outside the cache's "
                                    f"{self.layout.num_kv_heads} KV heads")
        win = object.__new__(KvBlocks)
        win.kv, win.num_blocks, win.staged = self.kv, self.num_blocks, True
        win.layout = dataclasses.replace(self.layout, num_kv_heads=stop - start,
                                         tensor_parallel_size=0)
        win.heads, win._bytes, win._row = (start, stop), None, row_dtype(win.layout.block_bytes)
        return win

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (``[..., heads, row]``) restricted to the window's heads, if any."""
        return t if self.heads is None else t[..., self.heads[0]:self.heads[1], :]

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

    def rows(self, lo: int, hi: int, ids: Sequence[int]) -> np.ndarray:
        """Row numbers, in payload order, of the blocks in ``kv`` viewed as
        ``[num_layers * planes * num_blocks, block_bytes]``: row = (layer * P + k) * N + id."""
        planes = self.layout.planes
        halves = np.arange(lo * planes, hi * planes, dtype=np.int64)[:, None] * self.num_blocks
        return (halves + np.asarray(ids, dtype=np.int64)[None, :]).reshape(-1)

    def row_items(self) -> np.ndarray:
        """The CPU cache as a 1-D array of rows, each one ``block_bytes`` item (``rows``
        numbers them), aliasing the tensor: what the gathers and scatters index."""
        assert self._bytes is not None, "row access needs a CPU cache"
        return self._bytes.view(self._row)

    def as_rows(self, data: np.ndarray) -> np.ndarray:
        """Contiguous uint8 bytes (whole rows) as rows of this cache (``row_items``)."""
        return data.view(self._row)

    def _index(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.long, device=self.kv.device)

    def gather(self, lo: int, hi: int, ids: Sequence[int]) -> torch.Tensor:
        """A host copy of ``kv[lo:hi, :, ids]`` (the staged send path)."""
        out = self._heads(_indexable(self.kv[lo:hi]).index_select(2, self._index(ids)))
        if out.device.type != "cpu":
            out = out.to("cpu", non_blocking=False)
        return out.contiguous().view(self.kv.dtype)

    def staging(self, lo: int, hi: int, count: int) -> torch.Tensor:
        """An empty host buffer shaped like a payload (the staged receive path)."""
        shape = self.layout.payload_shape(hi - lo, count)
        pin = self.is_cuda and torch.cuda.is_available()
        return torch.empty(shape, dtype=self.kv.dtype, pin_memory=pin)

    def scatter(self, lo: int, hi: int, ids: Sequence[int], host: torch.Tensor) -> None:
        """Write a received host payload into ``kv[lo:hi, :, ids]``; on CUDA the copy has
        finished when this returns, so a ``release`` after it cannot race a write in flight."""
        src = _indexable(host.to(self.kv.device, non_blocking=False))
        self._heads(_indexable(self.kv[lo:hi])).index_copy_(2, self._index(ids), src)
        if self.is_cuda:
            torch.cuda.current_stream(self.kv.device).synchronize()


def _indexable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or its bytes (same shape) for an fp8 cache: torch has no float8 index kernels
    on the CPU."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def row_dtype(block_bytes: int) -> np.dtype:
    """One block row as a single numpy item. Indexing whole rows as items of a 1-D array
    copies each with one memcpy: a scatter of 6 KiB rows takes 6-12% less CPU than through a
    ``[rows, block_bytes]`` uint8 view, a gather the same or a little less
    (bench/transfer/tcp_paths.py)."""
    return np.dtype((np.void, block_bytes))


def tensor_bytes(t: torch.Tensor) -> Buffer:
    """A flat byte view of a contiguous CPU tensor (any dtype, bf16 included)."""
    return t.view(torch.uint8).reshape(-1).numpy()


CHUNK_BYTES = 512 << 10  # staging chunk: small enough to stay in cache between passes


def chunk_bytes(block_bytes: int) -> int:
    """Bytes of one staging chunk for rows of ``block_bytes``: whole rows, about
    ``CHUNK_BYTES`` (at least one row)."""
    return max(1, CHUNK_BYTES // block_bytes) * block_bytes


class SendSpan:
    """What one KV frame sends: source layers and block ids."""

    __slots__ = ("blocks", "lo", "hi", "ids", "nbytes", "_host")

    def __init__(self, blocks: KvBlocks, lo: int, hi: int, ids: Sequence[int]) -> None:
        self.blocks, self.lo, self.hi, self.ids = blocks, lo, hi, list(ids)
        self.nbytes = blocks.nbytes(lo, hi, len(self.ids))
        self._host: torch.Tensor | None = None

    @property
    def shape(self) -> list[int]:
        """The payload's shape ``[layers, planes, blocks, block_size, kv_heads, row_width]``."""
        return self.blocks.layout.payload_shape(self.hi - self.lo, len(self.ids))

    def chunks(self, bounce: np.ndarray) -> Iterator[np.ndarray]:
        """The payload in order, as contiguous uint8 pieces of at most ``bounce.nbytes``
        (``chunk_bytes(block_bytes)`` or more). On a CPU cache each piece is gathered into
        ``bounce`` (one ``np.take`` of whole rows) and is valid until the next is asked for;
        a staged span gathers the frame once and yields slices of it."""
        if self.blocks.staged:
            host = self.gather_all()
            step = bounce.nbytes
            for a in range(0, host.nbytes, step):
                yield host[a:a + step]
            return
        blocks = self.blocks
        bb = blocks.layout.block_bytes
        rows = blocks.rows(self.lo, self.hi, self.ids)
        take = blocks.row_items().take
        per = bounce.nbytes // bb
        assert per >= 1, "staging chunk smaller than one block"
        for i in range(0, len(rows), per):
            sub = rows[i:i + per]
            out = bounce[:len(sub) * bb]
            # mode="wrap" skips numpy's buffered bounds checking; ids are checked already.
            take(sub, out=blocks.as_rows(out), mode="wrap")
            yield out

    def fill(self, out: np.ndarray, step: int) -> Iterator[np.ndarray]:
        """Gather the payload straight into the flat uint8 array ``out`` (``nbytes`` long),
        piece by piece in order, yielding each piece (a view of ``out``, whole rows of about
        ``step`` bytes) once it is written: the caller can hash it while it is in cache. On
        a CPU cache each piece is one ``np.take`` from the blocks into ``out``; a staged span
        gathers the frame to the host first and copies it over piece by piece."""
        bb = self.blocks.layout.block_bytes
        per = max(1, step // bb)
        flat = out[:self.nbytes]
        if self.blocks.staged:
            host = self.gather_all()
            for a in range(0, self.nbytes, per * bb):
                piece = flat[a:a + per * bb]
                piece[...] = host[a:a + per * bb]
                yield piece
            return
        blocks = self.blocks
        rows = blocks.rows(self.lo, self.hi, self.ids)
        take = blocks.row_items().take
        for i in range(0, len(rows), per):
            sub = rows[i:i + per]
            piece = flat[i * bb:(i + len(sub)) * bb]
            # mode="wrap" skips numpy's buffered bounds checking; ids are checked already.
            take(sub, out=blocks.as_rows(piece), mode="wrap")
            yield piece

    def gather_all(self) -> np.ndarray:
        """The whole payload in one contiguous host array (codecs encode whole frames)."""
        if self.blocks.staged:
            self._host = self.blocks.gather(self.lo, self.hi, self.ids)
            return tensor_bytes(self._host)
        out = np.empty(self.nbytes, dtype=np.uint8)
        for _ in self.fill(out, self.nbytes):  # one np.take of every row
            pass
        return out

    def release(self) -> None:
        """Drop the staging buffer, if any."""
        self._host = None


class RecvSpan:
    """Where one KV frame lands: destination layers and block ids."""

    __slots__ = ("blocks", "lo", "hi", "ids", "nbytes", "_host", "_rows")

    def __init__(self, blocks: KvBlocks, lo: int, hi: int, ids: Sequence[int]) -> None:
        self.blocks, self.lo, self.hi, self.ids = blocks, lo, hi, list(ids)
        self.nbytes = blocks.nbytes(lo, hi, len(self.ids))
        self._host: torch.Tensor | None = None
        self._rows: np.ndarray | None = None

    @property
    def shape(self) -> list[int]:
        """The payload's shape ``[layers, planes, blocks, block_size, kv_heads, row_width]``."""
        return self.blocks.layout.payload_shape(self.hi - self.lo, len(self.ids))

    @property
    def buffered_bytes(self) -> int:
        """Bytes of staging memory this span holds right now."""
        return 0 if self._host is None else self.nbytes

    def _staging(self) -> np.ndarray:
        if self._host is None:
            self._host = self.blocks.staging(self.lo, self.hi, len(self.ids))
        return tensor_bytes(self._host)

    def target(self, at: int, n: int, bounce: np.ndarray) -> np.ndarray:
        """Where to receive payload bytes ``[at, at + n)`` before ``land``: the frame's host
        staging buffer itself when staged (``land`` then has nothing to copy), else
        ``bounce``."""
        if self.blocks.staged:
            return self._staging()[at:at + n]
        return bounce[:n]

    def land(self, at: int, data: np.ndarray) -> None:
        """Write payload bytes ``[at, at + data.nbytes)`` (whole rows, ``at`` a row boundary):
        on a CPU cache into the blocks themselves (one numpy scatter); staged, into the host
        buffer that ``finish`` moves to the device. The caller has checked the reservation is
        alive with no await since (the fence)."""
        if self.blocks.staged:
            host = self._staging()
            dest = host[at:at + data.nbytes]
            if dest.ctypes.data != data.ctypes.data:
                dest[:] = data
            return
        bb = self.blocks.layout.block_bytes
        if self._rows is None:
            self._rows = self.blocks.rows(self.lo, self.hi, self.ids)
        first = at // bb
        blocks = self.blocks
        blocks.row_items()[self._rows[first:first + data.nbytes // bb]] = blocks.as_rows(data)

    def finish(self) -> None:
        """Land a staged payload in the cache (no-op for CPU caches)."""
        if self._host is not None:
            self.blocks.scatter(self.lo, self.hi, self.ids, self._host)

    def release(self) -> None:
        """Drop the staging buffer, if any."""
        self._host = None
