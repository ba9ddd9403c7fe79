"""The LoRA adapter identity at the KV handshake: a push of KV computed under another adapter
(or under the base model, for a request with one) is refused at BEGIN with
``adapter_mismatch`` and writes nothing; the matching adapter's push lands bit for bit."""

from __future__ import annotations

import pytest
import torch

from tandem.kv_transfer import Committed
from tandem.kv_transfer.errors import TransferRejected
from tandem.kv_transfer.testing import blocks_equal, deadline, finish, make_pair, run, tiny_layout

LAYOUT = tiny_layout("bfloat16", layers=2)


@pytest.mark.parametrize("reserved,pushed", [("a@0123", "b@4567"), ("a@0123", "a@89ab"),
                                             ("a@0123", ""), ("", "a@0123")])
def test_a_push_under_another_adapter_is_refused(reserved: str, pushed: str) -> None:
    async def body() -> None:
        p = await make_pair("tcp", LAYOUT)
        src, dst = [1, 2], [5, 6]
        p.rx.reserve("t", dst, lease_s=30, adapter=reserved)
        t = await p.tx.open("t", p.endpoint, src, dst, deadline(), adapter=pushed)
        t.push(0, LAYOUT.num_layers)
        failed = await t.wait_ended()
        assert isinstance(failed, TransferRejected) and failed.code == "adapter_mismatch"
        assert not p.dst.view(torch.uint8).any()  # nothing written
        p.rx.release("t")
        # the same blocks under a push of the reserved adapter
        p.rx.reserve("u", dst, lease_s=30, adapter=reserved)
        t = await p.tx.open("u", p.endpoint, src, dst, deadline(), adapter=reserved)
        t.push(0, LAYOUT.num_layers)
        await t.commit(3, -0.5)
        assert await p.rx.events.get() == Committed("u", tuple(dst), 3, -0.5)
        assert blocks_equal(p.src, src, p.dst, dst)
        await finish(p)

    run(body())
