"""A decode worker's live-move RPCs in one process (real engines, kv_transfer over TCP
loopback): a stream moved to a reservation on the same worker (its own receiver the target)
reads on equal to one engine's greedy output; so does one sequence of a forked request,
moved alone while its sibling reads on where it was; a hostile MoveOut (a wrong last token, block count or layout) is refused and leaves the stream
suspended, to be resumed; a suspension nobody resolves ends at the attach lease; nothing is
left held on any path.

Ordering: a moved request asks for ``LONG`` tokens and is suspended right after its first
streamed message, so it cannot finish first by hundreds of decode steps; the suspension's
success is asserted."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.common.wire import FAULT_KEY, SUSPENDED_FAULT
from tandem.protos.v1 import worker_pb2
from tests.unit.worker.harness import Cluster, cluster, greedy, reference, until

PROMPT = [5 + (i * 37) % 240 for i in range(41)]
LONG = 300


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=96, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16))


async def _suspended(c: Cluster, rid: str) -> list[int]:
    """A long request prefilled and streaming, then suspended: every token it made (the
    stream ends with the suspension's trailer after them)."""
    res = await c.reserve(rid, PROMPT, greedy(LONG))
    first = await c.prefill_into(rid, PROMPT, greedy(LONG), res)
    tokens = [first.first_token]
    stream = c.decode_stub.Decode(worker_pb2.DecodeRequest(request_id=rid))
    tokens += (await stream.read()).token_ids
    made = (await c.decode_stub.Suspend(worker_pb2.SuspendRequest(request_id=rid))
            ).num_output_tokens
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while (msg := await stream.read()) is not grpc.aio.EOF:
            tokens += msg.token_ids
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert (FAULT_KEY, SUSPENDED_FAULT) in tuple(err.value.trailing_metadata())
    assert len(tokens) == made < LONG
    return tokens


def test_moved_to_a_reservation_reads_on(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, LONG)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine, decode_sender=True) as c:
            sent = await _suspended(c, "r1")
            target = await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r1.1", token_ids=PROMPT + sent[:-1], sampling=greedy(LONG),
                lease_s=10, prior_output_tokens=len(sent) - 1, moved_in=True))
            assert target.cached_tokens >= 32  # the prompt's full blocks, cached here
            moved = await c.decode_stub.MoveOut(worker_pb2.MoveOutRequest(
                request_id="r1", transfer_id=target.transfer_id, block_ids=target.block_ids,
                kv_endpoint=target.kv_endpoint, layout=target.layout,
                skip_tokens=target.skip_tokens, last_token=sent[-1]))
            assert moved.bytes > 0
            msgs = await c.decode_all("r1.1")
            assert sent + [t for m in msgs for t in m.token_ids] == want
            assert not msgs[0].text.startswith("\ufffd")
            await c.settle()  # r1 freed here once committed there (after MoveOut's reply)
            with pytest.raises(grpc.aio.AioRpcError) as err:  # r1 is gone from here
                await c.decode_stub.Resume(worker_pb2.ResumeRequest(request_id="r1"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())


def test_a_forked_sequence_moves_alone(engines) -> None:
    """Sequence 1 of a request forked in two (prefilled on the decode worker itself) moves to
    a reservation of its own; its prompt's full blocks are cached there already (its
    sibling's), so only the blocks after them are pushed. Both read on to the greedy output."""
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, LONG)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine, decode_sender=True) as c:
            stub = c.decode_stub
            await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="f", token_ids=PROMPT, sampling=greedy(LONG), lease_s=10, n=2))
            first = await stub.PrefillLocal(worker_pb2.PrefillLocalRequest(request_id="f"))
            assert [t.token_id for t in first.first_tokens] == want[:1] * 2
            stream = stub.Decode(worker_pb2.DecodeRequest(request_id="f", index=1))
            sent = want[:1] + list((await stream.read()).token_ids)
            made = (await stub.Suspend(worker_pb2.SuspendRequest(request_id="f", index=1))
                    ).num_output_tokens
            with pytest.raises(grpc.aio.AioRpcError):
                while (msg := await stream.read()) is not grpc.aio.EOF:
                    sent += msg.token_ids
            assert len(sent) == made < LONG
            target = await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="f-1", token_ids=PROMPT + sent[:-1], sampling=greedy(LONG),
                lease_s=10, prior_output_tokens=len(sent) - 1, moved_in=True))
            # at least the prompt's full blocks (greedy, the sibling's output is the same, so
            # its blocks cached since may match further)
            assert len(PROMPT) // 16 * 16 <= target.cached_tokens < len(PROMPT) + len(sent) - 1
            assert target.cached_tokens % 16 == 0
            moved = await stub.MoveOut(worker_pb2.MoveOutRequest(
                request_id="f", index=1, transfer_id=target.transfer_id,
                block_ids=target.block_ids, kv_endpoint=target.kv_endpoint,
                layout=target.layout, skip_tokens=target.cached_tokens, last_token=sent[-1]))
            assert moved.bytes > 0
            msgs = await c.decode_all("f-1")
            assert sent + [t for m in msgs for t in m.token_ids] == want
            rest = [m async for m in stub.Decode(worker_pb2.DecodeRequest(request_id="f"))]
            assert want[:1] + [t for m in rest for t in m.token_ids] == want
            await c.settle()  # every block back: the moved sequence's and the shared ones

    asyncio.run(main())


def test_refusals_and_a_hostile_move_out(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, LONG)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine, decode_sender=True,
                           attach_lease_s=2.0) as c:
            stub = c.decode_stub
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Suspend(worker_pb2.SuspendRequest(request_id="nobody"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r0", token_ids=PROMPT, sampling=greedy(8), lease_s=10, n=2))
            with pytest.raises(grpc.aio.AioRpcError) as err:  # a sequence it does not fork
                await stub.Suspend(worker_pb2.SuspendRequest(request_id="r0", index=2))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            await stub.Abort(worker_pb2.AbortRequest(request_id="r0"))

            sent = await _suspended(c, "r1")
            target = await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r1.1", token_ids=PROMPT + sent[:-1], sampling=greedy(LONG),
                lease_s=10, prior_output_tokens=len(sent) - 1, moved_in=True))
            good = worker_pb2.MoveOutRequest(
                request_id="r1", transfer_id=target.transfer_id, block_ids=target.block_ids,
                kv_endpoint=target.kv_endpoint, layout=target.layout,
                skip_tokens=target.skip_tokens, last_token=sent[-1])
            for field, value, code in (
                    ("last_token", sent[-1] + 1, grpc.StatusCode.INVALID_ARGUMENT),
                    ("block_ids", [*target.block_ids, 1], grpc.StatusCode.INVALID_ARGUMENT),
                    ("skip_tokens", 5, grpc.StatusCode.INVALID_ARGUMENT),
                    ("layout", worker_pb2.KVLayout(model="other", block_size=16),
                     grpc.StatusCode.FAILED_PRECONDITION)):
                bad = worker_pb2.MoveOutRequest()
                bad.CopyFrom(good)
                if field == "block_ids":
                    del bad.block_ids[:]
                    bad.block_ids.extend(value)
                elif field == "layout":
                    bad.layout.CopyFrom(value)
                else:
                    setattr(bad, field, value)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.MoveOut(bad)
                assert err.value.code() == code, field
            await stub.Abort(worker_pb2.AbortRequest(request_id="r1.1"))
            assert (await stub.Resume(worker_pb2.ResumeRequest(request_id="r1"))).resumed
            msgs = await c.decode_all("r1")
            assert sent + [t for m in msgs for t in m.token_ids] == want

            # Suspended and never resolved (the router went away): the attach lease ends it.
            await _suspended(c, "r2")
            await until(c.decode_stats, lambda s: s.num_running == 0
                        and s.num_free_blocks == s.num_blocks, timeout=30)

    asyncio.run(main())


def _precopy(rid: str, pre: worker_pb2.ReserveResponse, tokens: list[int]
             ) -> worker_pb2.PreCopyRequest:
    return worker_pb2.PreCopyRequest(
        request_id=rid, transfer_id=pre.transfer_id, block_ids=pre.block_ids,
        kv_endpoint=pre.kv_endpoint, layout=pre.layout, skip_tokens=pre.skip_tokens,
        token_ids=tokens)


def test_precopy_while_decoding_then_the_tail(engines) -> None:
    """A pre-copy of the stream's leading full blocks into a pre-copy reservation (on this
    same worker, its own receiver the target) while the stream decodes on: tokens keep
    coming after it; then the move's reservation finds those blocks cached, MoveOut pushes
    the rest, and the stream reads on equal to the greedy output. Hostile PreCopies and
    pre-copy Reserves are refused, changing nothing; a pre-copy nobody frees ends at its
    lease; every block is free at the end."""
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, LONG)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine, decode_sender=True) as c:
            stub = c.decode_stub
            res = await c.reserve("r1", PROMPT, greedy(LONG))
            first = await c.prefill_into("r1", PROMPT, greedy(LONG), res)
            sent = [first.first_token]
            stream = stub.Decode(worker_pb2.DecodeRequest(request_id="r1"))
            sent += (await stream.read()).token_ids
            lead = PROMPT[:32]
            for bad_reserve in (
                    worker_pb2.ReserveRequest(request_id="x", token_ids=PROMPT[:20],
                                              sampling=greedy(1), precopy=True),
                    worker_pb2.ReserveRequest(request_id="x", token_ids=lead, n=2,
                                              sampling=greedy(1), precopy=True)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Reserve(bad_reserve)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            pre = await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r1.p", token_ids=lead, sampling=greedy(1), lease_s=30,
                precopy=True))
            good = _precopy("r1", pre, lead)
            for field, value, code in (
                    ("request_id", "nobody", grpc.StatusCode.NOT_FOUND),
                    ("token_ids", [t + 1 for t in lead], grpc.StatusCode.INVALID_ARGUMENT),
                    ("token_ids", PROMPT[:24], grpc.StatusCode.INVALID_ARGUMENT),
                    ("block_ids", [*pre.block_ids, 1], grpc.StatusCode.INVALID_ARGUMENT),
                    ("skip_tokens", 5, grpc.StatusCode.INVALID_ARGUMENT),
                    ("layout", worker_pb2.KVLayout(model="other", block_size=16),
                     grpc.StatusCode.FAILED_PRECONDITION)):
                bad = worker_pb2.PreCopyRequest()
                bad.CopyFrom(good)
                if field in ("token_ids", "block_ids"):
                    del getattr(bad, field)[:]
                    getattr(bad, field).extend(value)
                elif field == "layout":
                    bad.layout.CopyFrom(value)
                else:
                    setattr(bad, field, value)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.PreCopy(bad)
                assert err.value.code() == code, field
            copied = await stub.PreCopy(good)
            assert copied.bytes > 0
            at_precopy = len(sent)
            sent += (await stream.read()).token_ids  # it decoded on: more tokens come
            assert len(sent) > at_precopy
            made = (await stub.Suspend(worker_pb2.SuspendRequest(request_id="r1"))
                    ).num_output_tokens
            with pytest.raises(grpc.aio.AioRpcError):
                while (msg := await stream.read()) is not grpc.aio.EOF:
                    sent += msg.token_ids
            assert len(sent) == made < LONG
            target = await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r1.1", token_ids=PROMPT + sent[:-1], sampling=greedy(LONG),
                lease_s=10, prior_output_tokens=len(sent) - 1, moved_in=True))
            # (one worker is source and target here: its running request's own blocks are
            # cached too, so what the pre-copy left on a target is the two-engine tests',
            # tests/unit/engine/test_migrate_side.py and tests/chaos/test_live_migration.py)
            assert (await stub.Abort(worker_pb2.AbortRequest(request_id="r1.p"))).found
            moved = await stub.MoveOut(worker_pb2.MoveOutRequest(
                request_id="r1", transfer_id=target.transfer_id, block_ids=target.block_ids,
                kv_endpoint=target.kv_endpoint, layout=target.layout,
                skip_tokens=target.skip_tokens, last_token=sent[-1]))
            assert moved.bytes == copied.bytes // len(pre.block_ids) * len(target.block_ids)
            msgs = await c.decode_all("r1.1")
            assert sent + [t for m in msgs for t in m.token_ids] == want

            # A pre-copy committed and never freed by its router: its lease ends it.
            res = await c.reserve("r2", PROMPT, greedy(LONG))
            await c.prefill_into("r2", PROMPT, greedy(LONG), res)
            pre = await stub.Reserve(worker_pb2.ReserveRequest(
                request_id="r2.p", token_ids=lead, sampling=greedy(1), lease_s=1,
                precopy=True))
            assert (await stub.PreCopy(_precopy("r2", pre, lead))).bytes > 0
            await stub.Abort(worker_pb2.AbortRequest(request_id="r2"))
            await c.settle()

    asyncio.run(main())
