"""KV payload codecs: how a KV frame's bytes travel, negotiated per connection at HELLO.

    raw    the cache's bytes as they are (the default; always available)
    zstd   lossless: each element's most significant byte (sign and exponent of a float)
           zstd-compressed, the other bytes as they are. Needs the optional ``zstandard``
           package (``pip install 'tandem-serve[kv-compress]'``).
           wire = | u32 BE c | c bytes: zstd(top byte plane) | the other byte planes |
    int8   lossy, float caches only: each channel (layer, K/V, kv head, dimension) divided
           by its absmax over the frame, then each head vector (layer, K/V, token, kv head)
           int8 with an fp16 absmax scale; dequantized into the receiver's cache dtype on
           landing ((head_dim + 2) / (2 x head_dim) of a bf16/fp16 payload: 0.52 at head
           dim 64; about a quarter of an fp32 one). An int8 cache travels as int8 already;
           a frame holding an inf or NaN goes raw.
           wire = | fp32 channel scales [layers, 2, heads, head_dim] |
                  | fp16 vector scales [layers, 2, blocks x block_size, heads] |
                  | int8 values, payload order |

The sender asks for one codec (``SenderConfig.codec``), the receiver allows a set
(``ReceiverConfig.codecs``) and answers with the one the connection uses: the sender's if
allowed and useful there (TCP only: shm and CUDA IPC never leave the host), else ``raw``. A
frame names its codec (``KV.enc``) and its wire size (``KV.wire``); ``nbytes`` stays the
decoded size and ``shape`` the payload's, checked against the frame's layers and blocks as
ever (a codec sizes its encoding from the shape). A frame a codec cannot shrink goes
raw. Wire bytes are authenticated (frame_mac.py) before a byte is decoded, and decoding never
produces other than exactly ``nbytes`` bytes.
"""

from __future__ import annotations

import abc
import importlib.util
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tandem.kv_transfer.errors import ConfigError, MalformedFrame
from tandem.kv_transfer.layout import KvLayout

_LEN = struct.Struct(">I")
FLOAT_KV = ("float32", "float16", "bfloat16")
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


Shape = Sequence[int]  # a payload's [layers, 2, blocks, block_size, kv_heads, row_width]


def _nbytes(shape: Shape, layout: KvLayout) -> int:
    return math.prod(shape) * layout.itemsize


class Codec(abc.ABC):
    """One way to put a KV payload on the wire. ``shape`` is the frame's payload shape
    (checked against its layers and blocks before any codec sees it)."""

    name: str
    lossy: bool = False

    def applies(self, layout: KvLayout) -> bool:
        """Whether this codec can encode payloads of ``layout``."""
        return True

    @abc.abstractmethod
    def max_wire(self, shape: Shape, layout: KvLayout) -> int:
        """The most wire bytes a payload of ``shape`` may take (receivers refuse more)."""

    @abc.abstractmethod
    def encode(self, raw: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray | None:
        """The wire bytes of the payload ``raw`` (flat uint8); None: send it raw."""

    @abc.abstractmethod
    def decode(self, wire: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray:
        """Exactly the payload's bytes from ``wire``; ``MalformedFrame`` if it is not a valid
        encoding of a payload of ``shape``."""


class Raw(Codec):
    """The cache's bytes as they are (never used to encode: raw frames skip codecs)."""

    name = "raw"

    def max_wire(self, shape: Shape, layout: KvLayout) -> int:
        return _nbytes(shape, layout)

    def encode(self, raw: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray | None:
        return None

    def decode(self, wire: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray:
        if wire.nbytes != _nbytes(shape, layout):
            raise MalformedFrame("raw payload of the wrong size")
        return wire


class Zstd(Codec):
    """Lossless: the top byte plane zstd-compressed (see the module docstring)."""

    name = "zstd"
    LEVEL = 1  # level 3 compresses KV no better here and encodes at half the speed

    def __init__(self) -> None:
        import zstandard  # optional: codec("zstd") checks it is installed

        self._zstd: Any = zstandard
        self._c = zstandard.ZstdCompressor(level=self.LEVEL)
        self._d = zstandard.ZstdDecompressor()

    def max_wire(self, shape: Shape, layout: KvLayout) -> int:
        return _nbytes(shape, layout) + _LEN.size

    def encode(self, raw: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray | None:
        item = layout.itemsize
        planes = raw.reshape(-1, item)
        top = np.ascontiguousarray(planes[:, item - 1])  # little-endian: the last byte
        packed = self._c.compress(top)
        if len(packed) >= top.nbytes:
            return None
        rest = np.ascontiguousarray(planes[:, :item - 1].T).reshape(-1)
        out = np.empty(_LEN.size + len(packed) + rest.nbytes, dtype=np.uint8)
        out[:_LEN.size] = np.frombuffer(_LEN.pack(len(packed)), dtype=np.uint8)
        out[_LEN.size:_LEN.size + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
        out[_LEN.size + len(packed):] = rest
        return out

    def decode(self, wire: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray:
        item = layout.itemsize
        count = math.prod(shape)
        if wire.nbytes < _LEN.size:
            raise MalformedFrame("zstd payload shorter than its length prefix")
        (c,) = _LEN.unpack(wire[:_LEN.size].tobytes())
        if _LEN.size + c + count * (item - 1) != wire.nbytes:
            raise MalformedFrame("zstd payload sizes do not add up to its frame")
        packed = wire[_LEN.size:_LEN.size + c]
        try:
            # The declared size must be the plane's: zstd would otherwise allocate what a
            # frame header claims.
            if self._zstd.frame_content_size(packed) != count:
                raise MalformedFrame("zstd frame does not declare the payload's size")
            top = self._d.decompress(packed, max_output_size=count)
        except self._zstd.ZstdError as exc:
            raise MalformedFrame(f"zstd payload does not decompress: {exc}") from exc
        if len(top) != count:
            raise MalformedFrame("zstd payload decompresses to the wrong size")
        out = np.empty((count, item), dtype=np.uint8)
        out[:, item - 1] = np.frombuffer(top, dtype=np.uint8)
        if item > 1:
            out[:, :item - 1] = wire[_LEN.size + c:].reshape(item - 1, count).T
        return out.reshape(-1)


class Int8(Codec):
    """Lossy 8-bit, in two scales (see the module docstring): each channel (layer, K/V, kv
    head, dimension) divided by its absmax over the frame's blocks, then absmax int8 per head
    vector (layer, K/V, token, kv head) with an fp16 scale. The channel scale takes out the
    outlier channels keys carry, which a vector's scale alone spends its 8 bits on (measured
    on SmolLM2's cache, relative RMS error of keys / values: a scale per block of 16 tokens
    1.3% / 1.0%, per vector 1.1% / 0.7%, a channel scale then one per block 0.50% / 0.84%,
    a channel scale then one per vector 0.42% / 0.61%)."""

    name = "int8"
    lossy = True

    def applies(self, layout: KvLayout) -> bool:
        # a float K/V cache (a latent layout's one plane has no per-head channels to scale)
        return (layout.kv_dtype in FLOAT_KV and layout.scale_bytes == 0
                and layout.kv_lora_rank == 0)

    @staticmethod
    def _sizes(shape: Shape) -> tuple[int, int, int]:
        """(channel scales, vector scales, values) of a payload of ``shape``."""
        layers, halves, blocks, bs, heads, dim = shape
        return (layers * halves * heads * dim, layers * halves * blocks * bs * heads,
                math.prod(shape))

    def max_wire(self, shape: Shape, layout: KvLayout) -> int:
        chans, vectors, values = self._sizes(shape)
        return 4 * chans + 2 * vectors + values

    def encode(self, raw: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray | None:
        layers, halves, blocks, bs, heads, dim = shape
        x = (torch.from_numpy(raw).view(_TORCH[layout.kv_dtype])
             .view(layers * halves, blocks * bs, heads, dim).float())
        chan = x.abs().amax(dim=1)  # [layer-halves, heads, dim]
        if not bool(torch.isfinite(chan).all()):  # inf/NaN in the cache: send it as it is
            return None
        chan = torch.where(chan > 0, chan, torch.ones_like(chan))
        x /= chan[:, None]  # now in [-1, 1]
        scale = (x.abs().amax(dim=3) / 127.0).half()  # [layer-halves, tokens, heads]
        wide = scale.float()
        inv = torch.where(wide > 0, 1.0 / wide, torch.zeros_like(wide))
        q = (x * inv[..., None]).round_().clamp_(-127, 127).to(torch.int8)
        return np.concatenate([chan.numpy().view(np.uint8).reshape(-1),
                               scale.numpy().view(np.uint8).reshape(-1),
                               q.numpy().view(np.uint8).reshape(-1)])

    def decode(self, wire: np.ndarray, shape: Shape, layout: KvLayout) -> np.ndarray:
        if wire.nbytes != self.max_wire(shape, layout):
            raise MalformedFrame("int8 payload of the wrong size")
        layers, halves, blocks, bs, heads, dim = shape
        chans, vectors, _ = self._sizes(shape)
        at = 4 * chans
        chan = torch.from_numpy(wire[:at].view(np.float32)).view(layers * halves, heads, dim)
        scale = torch.from_numpy(wire[at:at + 2 * vectors].view(np.float16)).float().view(
            layers * halves, blocks * bs, heads)
        if not (bool(torch.isfinite(chan).all()) and bool(torch.isfinite(scale).all())
                and bool((chan > 0).all()) and bool((scale >= 0).all())):
            raise MalformedFrame("int8 payload has a non-positive or non-finite scale")
        q = torch.from_numpy(wire[at + 2 * vectors:].view(np.int8)).view(
            layers * halves, blocks * bs, heads, dim)
        x = q.float() * scale[..., None]
        x *= chan[:, None]
        return x.to(_TORCH[layout.kv_dtype]).view(torch.uint8).numpy().reshape(-1)


RAW = Raw()
NAMES = ("raw", "zstd", "int8")
_MADE: dict[str, Codec] = {"raw": RAW}


def available(name: str) -> bool:
    """Whether codec ``name`` exists and its package is installed."""
    if name == "zstd":
        return importlib.util.find_spec("zstandard") is not None
    return name in NAMES


def codec(name: str) -> Codec:
    """The codec called ``name``; ``ConfigError`` for an unknown one or one whose optional
    package is missing (saying what to install)."""
    if name not in NAMES:
        raise ConfigError(f"unknown KV codec {name!r}; one of {', '.join(NAMES)}")
    if not available(name):
        raise ConfigError(f"KV codec {name!r} needs the zstandard package: "
                          "pip install 'tandem-serve[kv-compress]'")
    if name not in _MADE:
        _MADE[name] = Zstd() if name == "zstd" else Int8()
    return _MADE[name]
