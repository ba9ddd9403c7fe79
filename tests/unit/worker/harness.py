"""In-process workers for unit tests: real engines, real kv_transfer over TCP loopback, both
services on one grpc.aio server on 127.0.0.1:0, and condition waits (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.sampling_params import SamplingParams
from tandem.kv_transfer import Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.testing import TEST_SECRET
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.worker.convert import kv_layout
from tandem.worker.decode.service import DecodeConfig, DecodeWorker
from tandem.worker.decode.servicer import DecodeServicer
from tandem.worker.prefill.service import PrefillConfig, PrefillWorker
from tandem.worker.prefill.servicer import PrefillServicer

T = TypeVar("T")


def greedy(max_tokens: int) -> tandem_pb2.SamplingParams:
    """Greedy sampling that ignores EOS (random tiny models emit it at random)."""
    return tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def reference(engine: Any, prompt: Sequence[int], max_tokens: int) -> list[int]:
    """A plain engine's greedy tokens for one prompt (the disaggregation contract)."""
    rid = engine.add_request(list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                          ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
    return tokens


async def until(check: Callable[[], Awaitable[T]], ok: Callable[[T], bool],
                timeout: float = 10.0) -> T:
    """Poll ``check`` until ``ok(value)``; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition never held; last value: {value}")
        await asyncio.sleep(0.02)


def idle(stats: worker_pb2.WorkerStats) -> bool:
    """Nothing running, waiting or reserved, and every block free."""
    return (stats.num_running == 0 and stats.num_waiting == 0 and stats.num_reserved == 0
            and stats.num_free_blocks == stats.num_blocks)


@dataclass
class Cluster:
    """One decode worker and one prefill worker, and stubs to both."""

    decode: DecodeWorker
    prefill: PrefillWorker
    receiver: Receiver
    sender: Sender
    decode_stub: worker_pb2_grpc.DecodeServiceStub
    prefill_stub: worker_pb2_grpc.PrefillServiceStub

    async def decode_stats(self) -> worker_pb2.WorkerStats:
        """The decode worker's Stats RPC."""
        return await self.decode_stub.Stats(worker_pb2.StatsRequest())

    async def prefill_stats(self) -> worker_pb2.WorkerStats:
        """The prefill worker's Stats RPC."""
        return await self.prefill_stub.Stats(worker_pb2.StatsRequest())

    async def reserve(self, rid: str, prompt: Sequence[int], sampling: tandem_pb2.SamplingParams,
                      lease_s: float = 10.0) -> worker_pb2.ReserveResponse:
        """Reserve on the decode worker."""
        return await self.decode_stub.Reserve(worker_pb2.ReserveRequest(
            request_id=rid, token_ids=prompt, sampling=sampling, lease_s=lease_s))

    async def prefill_into(self, rid: str, prompt: Sequence[int],
                           sampling: tandem_pb2.SamplingParams,
                           res: worker_pb2.ReserveResponse) -> worker_pb2.PrefillResponse:
        """Prefill on the prefill worker into a reservation."""
        return await self.prefill_stub.Prefill(worker_pb2.PrefillRequest(
            request_id=rid, token_ids=prompt, sampling=sampling, transfer_id=res.transfer_id,
            block_ids=res.block_ids, skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint, layout=res.layout))

    async def decode_all(self, rid: str) -> list[tandem_pb2.GenerateResponse]:
        """Read a Decode stream to its end."""
        return [msg async for msg in self.decode_stub.Decode(worker_pb2.DecodeRequest(
            request_id=rid))]

    async def settle(self) -> None:
        """Wait until both workers hold nothing (the leak check's precondition)."""
        await until(self.decode_stats, idle)
        await until(self.prefill_stats, idle)
        await until(self._transfer_stats, lambda s: s == (0, 0, 0))

    async def _transfer_stats(self) -> tuple[int, int, int]:
        r = self.receiver.stats()
        return r.reservations, r.held_blocks, self.sender.stats().transfers


@contextlib.asynccontextmanager
async def cluster(decode_engine: Any, prefill_engine: Any, *, attach_lease_s: float = 60.0,
                  drain_orphan_grace_s: float = 5.0, connect_timeout_s: float = 5.0,
                  transfer_timeout_s: float = 30.0, decode_sender: bool = False
                  ) -> AsyncIterator[Cluster]:
    """Start both workers in this process; on a clean exit, check nothing is left held.
    ``decode_sender``: the decode worker can push a live move's KV (to itself, here)."""
    dae, pae = AsyncEngine(decode_engine), AsyncEngine(prefill_engine)
    receiver = Receiver(decode_engine.remote.kv_cache,
                        kv_layout(decode_engine.remote.kv_cache_spec()),
                        ReceiverConfig(secret=TEST_SECRET, enable_shm=False))
    await receiver.start()
    mover = Sender(decode_engine.remote.kv_cache, kv_layout(decode_engine.remote.kv_cache_spec()),
                   SenderConfig(secret=TEST_SECRET, prefer_shm=False)) if decode_sender else None
    decode = DecodeWorker(dae, receiver, DecodeConfig(
        "decode-test", attach_lease_s=attach_lease_s, drain_orphan_grace_s=drain_orphan_grace_s),
        sender=mover)
    await decode.start()
    sender = Sender(prefill_engine.remote.kv_cache,
                    kv_layout(prefill_engine.remote.kv_cache_spec()),
                    SenderConfig(secret=TEST_SECRET, prefer_shm=False,
                                 connect_timeout_s=connect_timeout_s))
    prefill = PrefillWorker(pae, sender, PrefillConfig("prefill-test", transfer_timeout_s))
    await prefill.start()
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(decode), server)
    worker_pb2_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(prefill), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    c = Cluster(decode, prefill, receiver, sender, worker_pb2_grpc.DecodeServiceStub(channel),
                worker_pb2_grpc.PrefillServiceStub(channel))
    try:
        yield c
        await c.settle()
    finally:
        await channel.close()
        await server.stop(None)
        await decode.close()
        await prefill.close()
