"""The cache layout both peers must share: the fingerprint checked at HELLO.

The engine hands each worker one tensor ``kv: [num_layers, planes, num_blocks, block_size,
num_kv_heads, row_width]``. ``KvLayout`` describes everything about it except ``num_blocks``,
which differs per worker. ``row_width`` is ``head_dim`` for float caches; an int8 cache appends
each head vector's scale as ``scale_bytes`` raw bytes, so a block carries its own scales:
``row_width = head_dim + scale_bytes / itemsize``. An fp8 cache (``float8_e4m3fn``) has
``row_width = head_dim`` and scales that no block carries, one for K and one for V in every
layer (``"per-tensor k=1.0 v=1.0"``) or in each (a checkpoint's calibrated ones: ``"per-layer
k=[0.11, 0.07] v=[...]"``, a deep model's by their range and a digest): ``kv_scales`` names
them, so two fp8 peers whose scales differ in any layer are refused at HELLO
(LayoutMismatchError) as surely as an fp8 peer and a 16-bit one.

    kv_lora_rank = 0   planes = 2 (0 = K, 1 = V), num_kv_heads heads of head_dim each
    kv_lora_rank > 0   planes = 1: multi-head latent attention's compressed cache (DeepSeek),
                       one shared head of head_dim = kv_lora_rank + the rotated key part

A latent layout never equals a K/V one (its fingerprint carries ``kv_lora_rank``), so a peer
serving the same model with decompressed K/V, or another split of the same row width, is
refused at HELLO.

``tensor_parallel_size`` N > 1 says the cache is rank 0's share of a tensor-parallel group
(tandem/engine/parallel/plan.py: each rank holds its own KV heads). A single-rank peer's
layout never equals it: moving rank 0's heads alone would leave the other ranks' caches empty.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import msgpack
import xxhash

from tandem.kv_transfer.errors import LayoutMismatchError, MalformedFrame

# Fields a peer may omit (their default, 0, meaning "none"); digested only when set.
_OPTIONAL = ("scale_bytes", "kv_lora_rank", "tensor_parallel_size", "kv_scales")

# Bytes per element of each cache dtype we can move (int8: values and per-vector scales;
# float8_e4m3fn: values, scales per tensor and layer); nothing here depends on the element being a float.
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1,
                            "float8_e4m3fn": 1}


@dataclass(frozen=True, slots=True)
class KvLayout:
    """A model's KV cache layout; two workers may exchange blocks only if these are equal."""

    model_id: str
    dtype: str  # the model's compute dtype
    kv_dtype: str  # the cache's storage dtype: the bytes that travel
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    scale_bytes: int = 0  # bytes of per-vector scales after each head vector (int8 caches)
    # > 0: one latent plane (MLA); its rows are kv_lora_rank latent values, then RoPE's part
    kv_lora_rank: int = 0
    # 0: one process holds every KV head; N > 1: rank 0's share of a group of N ranks
    tensor_parallel_size: int = 0
    # scales no block carries (fp8 caches' per-tensor or per-layer ones:
    # tandem/engine/quant/kv_fp8.py Fp8Scales.layout); "" none
    kv_scales: str = ""

    def __post_init__(self) -> None:
        if self.kv_dtype not in ITEMSIZE:
            raise ValueError(f"unsupported kv_dtype {self.kv_dtype!r}; one of {sorted(ITEMSIZE)}")
        for name in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KvLayout.{name} must be > 0")
        if self.scale_bytes < 0 or self.scale_bytes % ITEMSIZE[self.kv_dtype]:
            raise ValueError("KvLayout.scale_bytes must be >= 0 and a multiple of the itemsize")
        if self.kv_lora_rank < 0:
            raise ValueError("KvLayout.kv_lora_rank must be >= 0")
        if self.tensor_parallel_size < 0 or self.tensor_parallel_size == 1:
            raise ValueError("KvLayout.tensor_parallel_size is 0 (one process) or >= 2")
        if self.kv_lora_rank and not (self.num_kv_heads == 1 and self.head_dim > self.kv_lora_rank
                                      and self.scale_bytes == 0):
            raise ValueError("a latent KvLayout (kv_lora_rank > 0) has one head wider than "
                             "kv_lora_rank and no scales")

    @property
    def planes(self) -> int:
        """Planes per layer: K and V, or the one latent plane."""
        return 1 if self.kv_lora_rank else 2

    @property
    def itemsize(self) -> int:
        """Bytes per cache element."""
        return ITEMSIZE[self.kv_dtype]

    @property
    def row_width(self) -> int:
        """Elements in the cache's last dimension: the head vector plus its scales, if any."""
        return self.head_dim + self.scale_bytes // self.itemsize

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer and plane: ``kv[l, k, b]`` (K, V or the latent)."""
        return self.block_size * self.num_kv_heads * self.row_width * self.itemsize

    @property
    def fingerprint(self) -> str:
        """Stable hex digest of the layout (same value in every process and on every host)."""
        # scale_bytes, kv_lora_rank and kv_scales join only when set, so K/V float layouts
        # keep their published digests.
        packed = msgpack.packb([getattr(self, f.name) for f in fields(self)
                                if f.name not in _OPTIONAL or getattr(self, f.name)])
        return xxhash.xxh3_64_hexdigest(packed)

    def payload_shape(self, num_layers: int, num_blocks: int) -> list[int]:
        """Shape of a payload carrying ``num_layers`` layers of ``num_blocks`` blocks."""
        return [num_layers, self.planes, num_blocks, self.block_size, self.num_kv_heads,
                self.row_width]

    def payload_bytes(self, num_layers: int, num_blocks: int) -> int:
        """Byte size of such a payload."""
        return num_layers * self.planes * num_blocks * self.block_bytes

    def to_wire(self) -> dict[str, Any]:
        """The layout as a msgpack-ready map (sent in the first HELLO)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, data: object) -> KvLayout:
        """Parse a peer's layout map, refusing anything that is not exactly typed."""
        if not isinstance(data, dict):
            raise MalformedFrame("layout is not a map")
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name in _OPTIONAL and value is None:  # absent from older peers' maps
                value = f.default
            want = str if f.type == "str" else int
            if type(value) is not want:
                raise MalformedFrame(f"layout.{f.name} missing or not {want.__name__}")
            kwargs[f.name] = value
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise MalformedFrame(f"layout: {exc}") from exc

    def diff(self, other: KvLayout) -> list[str]:
        """Human-readable differences, e.g. ``["kv_dtype: bfloat16 != float16"]``."""
        return [
            f"{f.name}: {getattr(self, f.name)} != {getattr(other, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]

    def check_compatible(self, other: KvLayout) -> None:
        """Raise ``LayoutMismatchError`` unless ``other`` is the same layout."""
        if other.fingerprint != self.fingerprint:
            raise LayoutMismatchError("layout mismatch: " + "; ".join(self.diff(other)))
