"""An fp8 (e4m3) cache over the wire: half a float16 cache's bytes for the same blocks, and
peers refused at HELLO when their dtype or their scales (per tensor, or any layer's) differ."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.kv_transfer import Committed, LayoutMismatchError, Sender, SenderConfig
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.testing import (
    TEST_SECRET,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    random_cache,
    run,
    settle_and_check,
    tiny_layout,
)
from tandem.kv_transfer.transport import TcpTransport

SCALES = "per-tensor k=1.0 v=1.0"  # tandem/engine/quant/kv_fp8.py Fp8Scales().layout
# Fp8Scales((0.5, 0.25, 0.5, 1.0), (0.125, 0.25, 0.25, 2.0)).layout: a checkpoint's, per layer
PER_LAYER = "per-layer k=[0.5, 0.25, 0.5, 1.0] v=[0.125, 0.25, 0.25, 2.0]"


def _fp8(kv_scales: str = SCALES) -> KvLayout:
    return dataclasses.replace(tiny_layout("float8_e4m3fn", layers=4), dtype="float32",
                               kv_scales=kv_scales)


def _pushed_bytes(layout: KvLayout, src_ids: list[int], dst_ids: list[int]) -> int:
    """Push ``src_ids`` over TCP into ``dst_ids``; the payload bytes the receiver counted."""
    async def body() -> int:
        p = await make_pair("tcp", layout)
        p.rx.reserve("t", dst_ids, lease_s=30)
        t = await p.tx.open("t", p.endpoint, src_ids, dst_ids, deadline())
        t.push(0, layout.num_layers)
        await t.commit(5, 0.0)
        assert isinstance(await p.rx.events.get(), Committed)
        assert blocks_equal(p.src, src_ids, p.dst, dst_ids)  # bit-exact, scales need no bytes
        got = p.rx.stats().bytes_received
        await finish(p)
        return got

    return run(body())


def test_fp8_blocks_cross_in_half_the_float16_bytes() -> None:
    src, dst = [3, 7, 1, 12, 0], [9, 2, 14, 5, 11]
    f16 = dataclasses.replace(tiny_layout("float16", layers=4), dtype="float32")
    f8 = _fp8()
    pushed8, pushed16 = _pushed_bytes(f8, src, dst), _pushed_bytes(f16, src, dst)
    assert pushed8 == f8.payload_bytes(4, len(src)) > 0
    assert pushed8 * 2 == pushed16


def test_per_layer_scales_cross_as_plain_bytes() -> None:
    f8 = _fp8(PER_LAYER)
    assert _pushed_bytes(f8, [3, 7], [9, 2]) == f8.payload_bytes(4, 2)
    assert f8.fingerprint != _fp8().fingerprint


@pytest.mark.parametrize("receiver,sender,field", [
    (_fp8(), dataclasses.replace(tiny_layout("float16", layers=4), dtype="float32"),
     "kv_dtype"),
    (_fp8(), _fp8("per-tensor k=0.5 v=1.0"), "kv_scales"),
    (_fp8(PER_LAYER), _fp8(PER_LAYER.replace("0.25, 2.0]", "0.25, 1.0]")), "kv_scales"),
    (_fp8(PER_LAYER), _fp8("per-tensor k=0.5 v=0.25"), "kv_scales"),
])
def test_hello_refuses_another_dtype_or_other_scales(receiver: KvLayout, sender: KvLayout,
                                                     field: str) -> None:
    async def body() -> None:
        p = await make_pair("tcp", receiver)
        cfg = SenderConfig(TEST_SECRET)
        tx = Sender(random_cache(sender, 4), sender, cfg, [TcpTransport(cfg.limits)])
        with pytest.raises(LayoutMismatchError, match=field):
            await tx.open("t", p.endpoint, [0], [1], deadline())
        stats = await p.rx.wait_until(lambda s: s.refusals.get("layout") == 1)
        assert stats.connections == 0 and stats.reservations == 0
        await settle_and_check(p.rx, tx)
        await finish(p)

    run(body())
