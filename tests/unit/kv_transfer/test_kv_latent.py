"""The latent layout of multi-head latent attention (one plane, one shared head per token):
its fingerprint, its payloads, bit-exact round trips over every transport, and a K/V peer of
the same bytes per block refused at HELLO."""

from __future__ import annotations

import logging

import pytest
import torch

from tandem.kv_transfer import Committed, LayoutMismatchError, SenderConfig, TlsConfig
from tandem.kv_transfer.errors import MalformedFrame
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.testing import (
    PAIR_KINDS,
    TEST_SECRET,
    blocks_equal,
    deadline,
    finish,
    make_pair,
    random_cache,
    run,
    settle_and_check,
)

# DeepSeek-V3's cache row: kv_lora_rank 512 + qk_rope_head_dim 64, one head
V3 = KvLayout("DeepSeek-V3", "bfloat16", "bfloat16", 16, 61, 1, 576, kv_lora_rank=512)
# tiny: a 32 + 8 latent row; its K/V twin moves the same bytes per layer and block
LATENT = KvLayout("tiny-mla", "float16", "float16", 4, 3, 1, 40, kv_lora_rank=32)
KV_TWIN = KvLayout("tiny-mla", "float16", "float16", 4, 3, 1, 20)


def test_a_latent_layout_has_one_plane_and_its_own_fingerprint() -> None:
    assert V3.planes == 1 and V3.block_bytes == 16 * 576 * 2
    assert V3.payload_shape(61, 3) == [61, 1, 3, 16, 1, 576]
    assert V3.payload_bytes(61, 1) == 61 * 16 * 576 * 2  # 70 KiB a token's block of 16
    assert LATENT.payload_bytes(3, 5) == KV_TWIN.payload_bytes(3, 5)
    digests = {LATENT.fingerprint, KV_TWIN.fingerprint,
               KvLayout("tiny-mla", "float16", "float16", 4, 3, 1, 40).fingerprint,
               KvLayout("tiny-mla", "float16", "float16", 4, 3, 1, 40,
                        kv_lora_rank=24).fingerprint}
    assert len(digests) == 4  # the rank/rope split is part of the layout
    with pytest.raises(LayoutMismatchError, match="kv_lora_rank: 32 != 0"):
        LATENT.check_compatible(KV_TWIN)
    assert KvLayout.from_wire(LATENT.to_wire()) == LATENT
    older = {k: v for k, v in KV_TWIN.to_wire().items() if k != "kv_lora_rank"}
    assert KvLayout.from_wire(older) == KV_TWIN  # a peer that never sends it means 0


@pytest.mark.parametrize("fields", [
    {"num_kv_heads": 2},  # one shared head only
    {"head_dim": 32},  # no rope part after the latent
    {"scale_bytes": 2},  # no int8 latent
    {"kv_lora_rank": -1},
])
def test_a_malformed_latent_layout_is_refused(fields: dict) -> None:
    wire = {**LATENT.to_wire(), **fields}
    with pytest.raises(ValueError):
        KvLayout(**wire)
    with pytest.raises(MalformedFrame):
        KvLayout.from_wire(wire)


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_latent_round_trip_is_bit_exact(kind: str, tls_config: TlsConfig) -> None:
    async def body() -> None:
        p = await make_pair(kind, LATENT, tls=tls_config)
        assert tuple(p.src.shape) == (3, 1, 16, 4, 1, 40)
        src_ids, dst_ids = [3, 7, 1, 12], [9, 2, 14, 5]
        p.rx.reserve("t-1", dst_ids, lease_s=30)
        t = await p.tx.open("t-1", p.endpoint, src_ids, dst_ids, deadline())
        for layer in range(LATENT.num_layers):
            t.push(layer, layer + 1)
        await t.commit(17, -1.25)
        assert await p.rx.events.get() == Committed("t-1", tuple(dst_ids), 17, -1.25)
        assert blocks_equal(p.src, src_ids, p.dst, dst_ids)
        untouched = [b for b in range(16) if b not in dst_ids]
        assert not p.dst[:, :, untouched].view(torch.uint8).any()
        await finish(p)

    run(body())


def test_a_kv_peer_of_the_same_bytes_is_refused_at_hello(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """A decode worker with the latent cache, a prefill worker with decompressed K/V rows of
    the same size: the push is refused before a byte moves."""
    async def body() -> None:
        p = await make_pair("tcp", LATENT)
        from tandem.kv_transfer import Sender
        from tandem.kv_transfer.transport import TcpTransport

        cfg = SenderConfig(TEST_SECRET)
        tx = Sender(random_cache(KV_TWIN, 4), KV_TWIN, cfg, [TcpTransport(cfg.limits)])
        with pytest.raises(LayoutMismatchError, match="kv_lora_rank"):
            await tx.open("t", p.endpoint, [0], [1], deadline())
        stats = await p.rx.wait_until(lambda s: s.refusals.get("layout") == 1)
        assert stats.connections == 0
        await settle_and_check(p.rx, tx)
        await finish(p)

    with caplog.at_level(logging.WARNING, logger="kv_transfer"):
        run(body())
    assert "LayoutMismatchError" in caplog.text
