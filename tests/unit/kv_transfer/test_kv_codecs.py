"""Payload codecs (tandem/kv_transfer/codecs.py): negotiated at HELLO, lossless ones bit-exact,
int8 within half a quantisation step, and an encoded frame from a hostile peer refused (its
MAC, its sizes, its scales, its compressed stream) before anything lands."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from tandem.kv_transfer import Aborted, Committed, ConfigError, ReceiverConfig, SenderConfig
from tandem.kv_transfer import codecs as codecs_module
from tandem.kv_transfer.codecs import Int8, available, codec
from tandem.kv_transfer.errors import MalformedFrame
from tandem.kv_transfer.frames import Kind
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    RawPeer,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    run,
    tiny_layout,
)

needs_zstd = pytest.mark.skipif(not available("zstd"), reason="zstandard not installed "
                                "(optional: pip install 'tandem-serve[kv-compress]')")
LOSSLESS = ["raw", pytest.param("zstd", marks=needs_zstd)]
FRAGMENTED, CONTIGUOUS = ([3, 7, 1, 12, 9], [14, 2, 5, 0, 11]), ([4, 5, 6, 7, 8], [8, 9, 10, 11, 12])


def smooth(kv: torch.Tensor, seed: int) -> torch.Tensor:
    """Fill ``kv`` with finite values like a model's (groups of very different magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(kv.shape, generator=g)
    x *= torch.logspace(-3, 2, kv.shape[2])[None, None, :, None, None, None]
    kv.copy_(x.to(kv.dtype))
    return kv


async def _push(p, src_ids: list[int], dst_ids: list[int], tid: str = "t") -> None:
    p.rx.reserve(tid, dst_ids, lease_s=30)
    t = await p.tx.open(tid, p.endpoint, src_ids, dst_ids, deadline())
    for layer in range(p.rx.layout.num_layers):
        t.push(layer, layer + 1)
    await t.commit(5, -0.5)
    assert isinstance(await p.rx.events.get(), Committed)


def _pair_cfg(name: str, allowed: tuple[str, ...] | None = None, **tx: object):
    allowed = (name,) if allowed is None else allowed
    return {"rx_config": ReceiverConfig(TEST_SECRET, codecs=tuple(c for c in allowed if c != "raw")),
            "tx_config": SenderConfig(TEST_SECRET, codec=name, **tx)}  # type: ignore[arg-type]


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("kind", ["tcp", "fake", "staged"])
@pytest.mark.parametrize("ids", [FRAGMENTED, CONTIGUOUS], ids=["fragmented", "contiguous"])
def test_lossless_codecs_are_bit_exact(name: str, kind: str, ids) -> None:
    async def body() -> None:
        layout = tiny_layout("bfloat16", layers=3)
        p = await make_pair(kind, layout, **_pair_cfg(name))
        smooth(p.src, 1)  # compressible like real KV: the top bytes repeat
        await _push(p, *ids)
        assert blocks_equal(p.src, ids[0], p.dst, ids[1])
        (conn,) = p.tx._pool.connections()
        assert conn.channel.codec.name == name
        await finish(p)

    run(body())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["tcp", "staged"])
@pytest.mark.parametrize("ids", [FRAGMENTED, CONTIGUOUS], ids=["fragmented", "contiguous"])
def test_int8_lands_within_half_a_step_of_each_value(dtype: str, kind: str, ids) -> None:
    async def body() -> None:
        layout = tiny_layout(dtype, layers=2)
        one = layout.payload_bytes(1, 1)
        p = await make_pair(kind, layout, **_pair_cfg("int8", frame_bytes=2 * one))  # split
        smooth(p.src, 2)
        await _push(p, *ids)
        src = p.src[:, :, ids[0]].float()
        got = p.dst[:, :, ids[1]].float()
        # Each value is c * s * an integer, c its channel's absmax over the frame (at most
        # over the whole transfer), s its vector's absmax of x / c over 127 (<= 1/127; fp16,
        # so the largest may clamp by s's rounding, 2^-11): off by at most half of c / 127
        # and that, plus the landing dtype's rounding.
        chan = src.abs().amax(dim=(2, 3), keepdim=True)
        rounding = src.abs() * (2 ** -7 if dtype == "bfloat16" else 2 ** -10)
        bound = chan / 127 * 0.5 + chan * 2 ** -11 + rounding + 1e-30
        assert ((got - src).abs() <= bound).all()
        assert ((got - src).abs() > 0).any()  # lossy: it really went through int8
        untouched = [b for b in range(16) if b not in ids[1]]
        assert not p.dst[:, :, untouched].view(torch.uint8).any()
        await finish(p)

    run(body())


def test_int8_halves_a_half_precision_layer_and_sends_inf_raw() -> None:
    layout = tiny_layout("float16", block_size=16, heads=3, head_dim=64)  # SmolLM2's
    c = Int8()
    shape = [1, 2, 128, 16, 3, 64]  # one layer of a 2,048-token prompt: what a push sends
    raw = smooth(torch.empty(shape, dtype=torch.float16), 3)
    wire = c.encode(raw.view(torch.uint8).numpy().reshape(-1), shape, layout)
    assert wire is not None and wire.nbytes == c.max_wire(shape, layout)
    assert wire.nbytes / (raw.numel() * 2) == pytest.approx((64 + 2) / 128, abs=0.002)
    raw[0, 0, 1, 3, 2, 5] = float("inf")
    assert c.encode(raw.view(torch.uint8).numpy().reshape(-1), shape, layout) is None


@pytest.mark.parametrize("case", ["not_allowed", "int8_cache", "shm"])
def test_a_codec_that_does_not_apply_leaves_the_connection_raw(case: str) -> None:
    async def body() -> None:
        layout = tiny_layout("float16")
        kind = "shm" if case == "shm" else "tcp"
        allowed = ("zstd",) if case == "not_allowed" else None
        if case == "int8_cache":  # the cache is int8 already: nothing to gain
            layout = tiny_layout("int8")
        p = await make_pair(kind, layout, **_pair_cfg("int8", allowed))
        await _push(p, *FRAGMENTED)
        assert blocks_equal(p.src, FRAGMENTED[0], p.dst, FRAGMENTED[1])  # raw: bit-exact
        (conn,) = p.tx._pool.connections()
        assert conn.channel.codec.name == "raw"
        await finish(p)

    if case == "not_allowed" and not available("zstd"):
        pytest.skip("zstandard not installed")
    run(body())


def test_config_refuses_unknown_and_missing_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown KV codec"):
        SenderConfig(TEST_SECRET, codec="lz5")
    with pytest.raises(ConfigError, match="unknown KV codec"):
        ReceiverConfig(TEST_SECRET, codecs=("int8", "gzip"))
    monkeypatch.setattr(codecs_module, "available", lambda name: name != "zstd")
    with pytest.raises(ConfigError, match="pip install 'tandem-serve\\[kv-compress\\]'"):
        SenderConfig(TEST_SECRET, codec="zstd")


# -- hostile encoded frames ----------------------------------------------------------------------

LAYOUT = tiny_layout("float16", layers=2)
RAW_BYTES = LAYOUT.payload_bytes(1, 1)


def _kv(enc: str, wire: int) -> dict[str, object]:
    return {"kind": Kind.KV, "transfer": "victim", "layers": [0, 1], "blocks": [3],
            "dtype": LAYOUT.kv_dtype, "shape": LAYOUT.payload_shape(1, 1), "nbytes": RAW_BYTES,
            "enc": enc, "wire": wire}


def _int8_wire(scale: float, chan: float = 1.0) -> bytes:
    chans = 2 * LAYOUT.num_kv_heads * LAYOUT.head_dim  # K and V, per head and dimension
    vectors = 2 * LAYOUT.block_size * LAYOUT.num_kv_heads  # K and V of one block's tokens
    return (struct.pack(f"<{chans}f", *[chan] * chans)
            + struct.pack(f"<{vectors}e", *[scale] * vectors) + bytes(RAW_BYTES // 2))


def _attacks() -> dict[str, tuple[str, str, bytes, int | None]]:
    """name -> (codec asked at HELLO, KV.enc, wire bytes, KV.wire if not their length)."""
    good = _int8_wire(0.5)
    out = {
        "not_negotiated": ("int8", "zstd", good, None),
        "wire_over_its_bound": ("int8", "int8", good + b"\0" * 8, None),
        "wire_short": ("int8", "int8", good[:-8], None),
        "nan_scale": ("int8", "int8", _int8_wire(float("nan")), None),
        "negative_scale": ("int8", "int8", _int8_wire(-1.0), None),
        "zero_channel_scale": ("int8", "int8", _int8_wire(0.5, chan=0.0), None),
        "inf_channel_scale": ("int8", "int8", _int8_wire(0.5, chan=float("inf")), None),
        "tampered": ("int8", "int8", good, -1),  # a changed byte: its MAC fails
    }
    if available("zstd"):
        import zstandard

        lie = zstandard.ZstdCompressor().compress(bytes(RAW_BYTES))  # declares 2x the plane
        zipped = struct.pack(">I", len(lie)) + lie + bytes(RAW_BYTES // 2)
        out["zstd_declares_another_size"] = ("zstd", "zstd", zipped, None)
        out["zstd_garbage"] = ("zstd", "zstd", struct.pack(">I", 8) + b"\x28\xb5\x2f\xfd" * 2
                               + bytes(RAW_BYTES // 2), None)
    return out


@pytest.mark.parametrize("attack", sorted(_attacks()))
def test_a_bad_encoded_frame_closes_the_connection_and_lands_nothing(attack: str) -> None:
    asked, enc, wire, size = _attacks()[attack]

    async def body() -> None:
        p = await make_pair("tcp", LAYOUT, dst_blocks=8,
                            rx_config=ReceiverConfig(TEST_SECRET, codecs=("int8", "zstd")
                                                     if available("zstd") else ("int8",)))
        peer = await RawPeer.connect(p.endpoint)
        ack = await peer.handshake(LAYOUT, codec=asked)
        assert ack["codec"] == asked
        p.rx.reserve("victim", [3], lease_s=30)
        await peer.send_frame({"kind": Kind.BEGIN, "transfer": "victim", "blocks": [3]})
        await p.rx.wait_until(lambda s: s.bound_transfers == 1)
        frame = bytearray(peer.frame_bytes(_kv(enc, len(wire)), wire))
        if size == -1:
            frame[-30] ^= 0x40  # inside the wire bytes, after the header's tag
        await peer.send_raw(bytes(frame))
        event = await p.rx.events.get()
        assert isinstance(event, Aborted) and event.code == "connection_lost", event
        expected = "bad_mac" if attack == "tampered" else "bad_frame"
        assert (await p.rx.wait_until(lambda s: s.refusals.get(expected) == 1)).connections == 0
        assert not p.dst.view(torch.uint8).any()  # nothing landed
        peer.close()
        await finish(p)

    run(body())


def test_decoders_never_produce_another_size() -> None:
    c = Int8()
    shape = LAYOUT.payload_shape(1, 1)
    with pytest.raises(MalformedFrame):
        c.decode(np.zeros(10, dtype=np.uint8), shape, LAYOUT)
    if available("zstd"):
        z = codec("zstd")
        with pytest.raises(MalformedFrame):
            z.decode(np.zeros(3, dtype=np.uint8), shape, LAYOUT)
