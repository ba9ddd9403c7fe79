"""DecodeService in process: errors at the edge, leases, aborts, cancelled streams, drain."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest

from tandem.common.wire import BUSY_KEY, GRAMMAR_BUSY, RETRY_AFTER_KEY
from tandem.engine.sampling_params import SamplingParams
from tandem.kv_transfer import Aborted, Committed, Endpoint
from tandem.protos.v1 import tandem_pb2, worker_pb2
from tandem.worker.errors import GRAMMAR_RETRY_AFTER_MS
from tests.integration.served_model import tiny_served_model
from tests.unit.engine._forward_hold import ForwardHold
from tests.unit.worker.harness import cluster, greedy, idle, until

PROMPT = list(range(10, 50))  # 40 tokens: three blocks of 16


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=8, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16))


async def _code(aw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await aw
    return err.value.code(), err.value.details() or ""


def test_reserve_errors(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            code, why = await _code(c.reserve("bad", [5, 300], greedy(4)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and why.startswith("prompt:")
            code, why = await _code(c.reserve("bad", [5], greedy(0)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in why
            code, why = await _code(c.reserve("", [5], greedy(4)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in why
            code, why = await _code(c.reserve("bad", [5], greedy(4), lease_s=-1))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "lease_s" in why

            await c.reserve("a", PROMPT, greedy(4))
            await c.reserve("b", PROMPT, greedy(4))  # 6 of 8 blocks now reserved
            code, _ = await _code(c.reserve("a", PROMPT, greedy(4)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT  # the id is in use
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await c.reserve("c", PROMPT, greedy(4))
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "free" in (full.value.details() or "")
            trailers = dict(full.value.trailing_metadata() or ())
            assert int(trailers[RETRY_AFTER_KEY]) > 0  # a full worker says when to come back
            assert BUSY_KEY not in trailers  # full is full: no other reason
            for rid in ("a", "b"):
                assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id=rid))).found
            assert not (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="a"))).found
            code, _ = await _code(c.decode_all("nobody"))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())


# Seconds of compile with SmolLM2's vocabulary (optional properties cost about quadratically):
# never done within the worker's 1 ms wait.
HEAVY_SCHEMA = json.dumps(
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}})


def test_a_grammar_still_compiling_is_busy_and_says_so(tiny_dir, smollm2_dir,
                                                       make_engine) -> None:
    path = str(tiny_served_model(tiny_dir, smollm2_dir))
    decode = make_engine(model=path, num_blocks=64, block_size=16,
                         grammar_compile_wait_s=0.001)
    prefill = make_engine(model=path, num_blocks=64, block_size=16)
    sampling = greedy(4)
    sampling.structured.CopyFrom(tandem_pb2.StructuredOutput(json_schema=HEAVY_SCHEMA))

    async def main() -> None:
        async with cluster(decode, prefill) as c:
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await c.reserve("s", PROMPT, sampling)
            assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "not compiled within" in (busy.value.details() or "")
            trailers = dict(busy.value.trailing_metadata() or ())
            # The reason travels typed (the router tells its client), with a longer hint
            # than a full cache's: a compile takes seconds.
            assert trailers[BUSY_KEY] == GRAMMAR_BUSY
            assert trailers[RETRY_AFTER_KEY] == str(GRAMMAR_RETRY_AFTER_MS)
            assert idle(await c.decode_stats())  # nothing was reserved

    asyncio.run(main())


def test_lease_expiry_frees_the_reservation(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            await c.reserve("late", PROMPT, greedy(4), lease_s=0.2)
            assert (await c.decode_stats()).num_reserved == 1
            await until(c.decode_stats, idle)
            code, why = await _code(c.decode_all("late"))
            assert code == grpc.StatusCode.ABORTED and "lease expired" in why

    asyncio.run(main())


def test_cancelled_decode_stream_aborts_the_request(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("long", PROMPT, greedy(60))
            await c.prefill_into("long", PROMPT, greedy(60), res)
            call = c.decode_stub.Decode(worker_pb2.DecodeRequest(request_id="long"))
            got = 0
            async for msg in call:
                got += len(msg.token_ids)
                if got >= 2:
                    break
            call.cancel()
            await until(c.decode_stats, idle)
            code, _ = await _code(c.decode_all("long"))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())


def test_a_stream_never_read_is_aborted_at_its_attach_lease(engines) -> None:
    """The router crashed between the prefill reply and its Decode call: the committed
    request is stopped and its blocks freed at the attach lease, not decoded to max_tokens
    for nobody (here it cannot finish on its own: no step makes a token)."""
    decode_engine = engines[0]
    held = threading.Event()
    plain_step = decode_engine.step

    def held_step():  # while held, a step makes nothing
        return [] if held.is_set() else plain_step()

    decode_engine.step = held_step

    async def main() -> None:
        async with cluster(*engines, attach_lease_s=0.2) as c:
            res = await c.reserve("unread", PROMPT, greedy(60))
            held.set()
            await c.prefill_into("unread", PROMPT, greedy(60), res)  # committed, never read
            await until(c.decode_stats, idle)
            held.clear()
            code, _ = await _code(c.decode_all("unread"))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())


def test_abort_while_streaming_ends_the_stream(engines) -> None:
    decode_engine = engines[0]
    aborted = threading.Event()
    plain_step, plain_abort = decode_engine.step, decode_engine.abort
    stepped = [0]  # steps that produced output before the Abort ran

    def held_step():  # one step with output, then none until the Abort has run: the stream
        # has a token to read whenever the test gets to it, and cannot finish before the Abort
        if aborted.is_set():
            return plain_step()
        if stepped[0] >= 1:
            return []
        out = plain_step()
        if out:
            stepped[0] += 1
        return out

    def abort(request_id: str):
        out = plain_abort(request_id)
        aborted.set()
        return out

    decode_engine.step, decode_engine.abort = held_step, abort

    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("ab", PROMPT, greedy(60))
            await c.prefill_into("ab", PROMPT, greedy(60), res)
            call = c.decode_stub.Decode(worker_pb2.DecodeRequest(request_id="ab"))
            msgs = []
            async for msg in call:
                msgs.append(msg)
                if len(msgs) == 1:  # ... the abort has run
                    await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="ab"))
            assert msgs[-1].finished and msgs[-1].finish_reason == "abort"
            code, _ = await _code(c.decode_all("ab"))
            assert code == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())


def test_draining_refuses_new_reservations(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            c.decode.begin_drain()
            code, why = await _code(c.reserve("d", PROMPT, greedy(4)))
            assert code == grpc.StatusCode.UNAVAILABLE and "draining" in why
            assert (await c.decode_stats()).draining
            await asyncio.wait_for(c.decode.wait_idle(), 5)

    asyncio.run(main())


@pytest.mark.parametrize("how", ["abort", "connection_lost"])
def test_push_that_dies_midway_frees_the_reservation(engines, how) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("mid", PROMPT, greedy(4))
            transfer = await c.sender.open(
                res.transfer_id, Endpoint.decode(res.kv_endpoint), [0, 1, 2],
                list(res.block_ids), time.monotonic() + 10)
            await transfer.send_layers(0, 1)  # one of two layers landed, then the sender dies
            if how == "abort":
                await transfer.abort("prefill worker gave up")
            else:
                await c.sender.close()
            await until(c.decode_stats, idle)
            code, why = await _code(c.decode_all("mid"))
            assert code == grpc.StatusCode.ABORTED and "KV transfer aborted" in why

    asyncio.run(main())


def test_abort_racing_its_reserve_grants_no_lease(engines) -> None:
    """An Abort that arrives while its Reserve is still in flight waits for it, then ends both
    the lease and the engine's reservation: no lease is left on blocks the engine freed."""
    async def main() -> None:
        async with cluster(*engines) as c:
            params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
            reserving = asyncio.create_task(c.decode.reserve("race", PROMPT, params, 60.0))
            await asyncio.sleep(0)  # the Reserve has claimed the id, the engine call pends
            assert await c.decode.abort("race")
            await reserving
            assert c.receiver.stats().reservations == 0
            assert (await c.decode_stats()).num_reserved == 0

    asyncio.run(main())


def test_prefill_local_after_commit_is_refused(engines) -> None:
    """Once the KV is committed the reservation has ended: PrefillLocal is the wrong state and
    the stream carries on untouched."""
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("done", PROMPT, greedy(6))
            first = await c.prefill_into("done", PROMPT, greedy(6), res)
            await until(c.decode_stats, lambda s: s.num_reserved == 0)
            code, why = await _code(c.decode_stub.PrefillLocal(
                worker_pb2.PrefillLocalRequest(request_id="done")))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "no pending" in why
            msgs = await c.decode_all("done")
            assert 1 + sum(len(m.token_ids) for m in msgs) == 6 and first.first_token >= 0

    asyncio.run(main())


async def _ended(c, *rids: str) -> bool:
    """Whether each request's stream holds its last message (finished with no reader yet)."""
    streams = c.decode._streams
    return all(rid in streams and streams[rid].ended for rid in rids)


def test_drain_keeps_a_finished_stream_for_its_late_reader(engines) -> None:
    """The router calls Decode after the prefill reply: a short request may finish before its
    reader comes. A drain starting then keeps the stream, so Decode still attaches and gets
    every token; a stream nobody ever reads is dropped at its attach lease, ending the drain
    with no block held."""
    async def main() -> None:
        async with cluster(*engines, attach_lease_s=3.0) as c:
            for rid in ("late", "orphan"):
                res = await c.reserve(rid, PROMPT, greedy(4))
                await c.prefill_into(rid, PROMPT, greedy(4), res)
            await until(lambda: _ended(c, "late", "orphan"), bool)
            c.decode.begin_drain()
            assert c.decode.busy()  # the drain waits for the late reader
            msgs = await c.decode_all("late")
            assert msgs[-1].finished and 1 + sum(len(m.token_ids) for m in msgs) == 4
            await asyncio.wait_for(c.decode.wait_idle(), 10)  # the orphan's lease ends it
            code, _ = await _code(c.decode_all("orphan"))
            assert code == grpc.StatusCode.NOT_FOUND
            assert idle(await c.decode_stats())

    asyncio.run(main())


def test_a_drain_waits_for_orphans_only_its_grace(engines) -> None:
    """Orphans ended before the drain (lease 600 s) and during it are dropped after the drain's
    grace, so a SIGTERM'd worker exits long before its pod's grace period runs out."""
    async def main() -> None:
        async with cluster(*engines, attach_lease_s=600.0, drain_orphan_grace_s=0.3) as c:
            res = await c.reserve("before", PROMPT, greedy(4))
            await c.prefill_into("before", PROMPT, greedy(4), res)
            await until(lambda: _ended(c, "before"), bool)
            during = await c.reserve("during", PROMPT, greedy(4))
            c.decode.begin_drain()
            await c.prefill_into("during", PROMPT, greedy(4), during)  # ends while draining
            await asyncio.wait_for(c.decode.wait_idle(), 10)
            for rid in ("before", "during"):
                code, _ = await _code(c.decode_all(rid))
                assert code == grpc.StatusCode.NOT_FOUND
            assert idle(await c.decode_stats())

    asyncio.run(main())


def test_drain_timeout_still_frees_an_orphan_never_read(engines) -> None:
    """An orphan whose lease outlives the drain timeout holds the drain only that long: the
    worker then closes, and close frees it; no KV block is left behind."""
    engine = engines[0]

    async def main() -> None:
        async with cluster(*engines, attach_lease_s=600.0, drain_orphan_grace_s=600.0) as c:
            res = await c.reserve("orphan", PROMPT, greedy(4))
            await c.prefill_into("orphan", PROMPT, greedy(4), res)
            await until(lambda: _ended(c, "orphan"), bool)
            c.decode.begin_drain()
            with pytest.raises(asyncio.TimeoutError):  # what serve()'s drain timeout does
                await asyncio.wait_for(c.decode.wait_idle(), 0.2)
        assert not c.decode.busy()  # closed: the stream is gone
        stats = engine.stats()
        assert stats.num_free_blocks == stats.num_blocks and stats.num_running == 0

    asyncio.run(main())


def test_commits_reported_together_apply_together_a_refused_one_alone(engines) -> None:
    """Two COMMITs on the receiver's queue at once (put there in one go; the receiver's
    leases on both ended first, so nothing else reports them) are applied as one batch: the
    one whose first token is outside the vocabulary ends its stream with the reason, the
    other decodes to its end; every block comes back."""

    async def main() -> None:
        async with cluster(*engines) as c:
            good = await c.reserve("good", PROMPT[:20], greedy(4))
            bad = await c.reserve("bad", PROMPT[20:], greedy(4))
            for r in (good, bad):
                c.receiver.release(r.transfer_id, "the test reports the commit itself")
            c.receiver.events.put_nowait(
                Committed(good.transfer_id, tuple(good.block_ids), 7, 0.0))
            c.receiver.events.put_nowait(
                Committed(bad.transfer_id, tuple(bad.block_ids), 10**6, 0.0))
            msgs = await c.decode_all("good")
            assert sum(len(m.token_ids) for m in msgs) == 3
            assert msgs[-1].finish_reason == "length"
            code, why = await _code(c.decode_all("bad"))
            assert "commit refused" in why, (code, why)
            await until(c.decode_stats, idle)

    asyncio.run(main())


def test_an_end_that_fails_costs_only_its_own_event_in_a_batch(engines) -> None:
    """A COMMIT and an ABORT reported together apply as one engine job: when ending the
    aborted reservation raises (a bug, forced here after the real end freed its blocks), the
    commit beside it still applies, is counted as committed, and its stream says what a commit
    alone says; the aborted request's stream still ends, with the abort's reason."""

    async def main() -> None:
        async with cluster(*engines) as c:
            decode = c.decode.engine.engine.remote.decode
            alone = await c.reserve("alone", PROMPT[:20], greedy(4))
            c.receiver.release(alone.transfer_id, "the test reports the events itself")
            c.receiver.events.put_nowait(
                Committed(alone.transfer_id, tuple(alone.block_ids), 40, 0.0))
            expected = "".join(m.text for m in await c.decode_all("alone"))
            good = await c.reserve("good", PROMPT[:20], greedy(4))
            bad = await c.reserve("bad", PROMPT[20:], greedy(4))
            for r in (good, bad):
                c.receiver.release(r.transfer_id, "the test reports the events itself")
            real_end = decode.end

            def end(transfer_id: str):  # type: ignore[no-untyped-def]
                out = real_end(transfer_id)
                if transfer_id == bad.transfer_id:
                    raise RuntimeError("forced: ending this reservation failed")
                return out

            decode.end = end
            try:
                c.receiver.events.put_nowait(
                    Committed(good.transfer_id, tuple(good.block_ids), 40, 0.0))
                c.receiver.events.put_nowait(Aborted(bad.transfer_id, tuple(bad.block_ids),
                                                     "test", "forced", "sender"))
                msgs = await c.decode_all("good")
            finally:
                decode.end = real_end
            assert sum(len(m.token_ids) for m in msgs) == 3
            assert msgs[-1].finish_reason == "length"
            assert "".join(m.text for m in msgs) == expected
            # the commit's handling ran: both commits counted (the batch's failure lost it)
            assert c.decode.metrics.instruments.get_sample_value(
                "tandem_kv_transfer_seconds_count", {"role": "decode"}) == 2
            code, why = await _code(asyncio.wait_for(c.decode_all("bad"), 60))  # ended anyway
            assert "aborted by the sender" in why, (code, why)
            await until(c.decode_stats, idle)

    asyncio.run(main())


def test_commits_and_a_reserve_queue_at_once_behind_a_held_engine(engines) -> None:
    """Forced order: the engine thread is held inside a call. Each COMMIT the receiver then
    reports has its engine work queued at once (the second not behind the first's reply),
    and a Reserve queues its own call behind them without waiting for them to apply.
    Released, they run in that order: the Reserve of a committed request's prompt finds its
    full blocks cached; both committed streams decode to their end; every block comes back."""

    async def main() -> None:
        async with cluster(*engines) as c:
            ae = c.decode.engine

            async def queued() -> int:
                return ae.pending_calls()

            a = await c.reserve("a", PROMPT, greedy(4))  # 40 tokens: 2 full blocks + 8
            b = await c.reserve("b", PROMPT[:20], greedy(4))
            for r in (a, b):
                c.receiver.release(r.transfer_id, "the test reports the commit itself")
            gate = threading.Event()
            held = ae.submit(lambda e: gate.wait(60))
            await until(queued, lambda n: n == 0)  # the engine thread is inside it
            try:
                c.receiver.events.put_nowait(Committed(a.transfer_id, tuple(a.block_ids), 7,
                                                       0.0))
                await until(queued, lambda n: n == 1)
                c.receiver.events.put_nowait(Committed(b.transfer_id, tuple(b.block_ids), 8,
                                                       0.0))
                await until(queued, lambda n: n == 2)  # not behind a's reply
                reserving = asyncio.create_task(c.reserve("c", PROMPT, greedy(4)))
                await until(queued, lambda n: n == 3)  # behind both, not waiting for them
            finally:
                gate.set()
            assert await held
            assert (await reserving).cached_tokens == 32  # a's commit ran first
            for rid in ("a", "b"):
                msgs = await c.decode_all(rid)
                assert sum(len(m.token_ids) for m in msgs) == 3
                assert msgs[-1].finish_reason == "length"
            assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="c"))).found
            await until(c.decode_stats, idle)  # every block free (the cluster checks more)

    asyncio.run(main())


def test_a_commit_and_a_reserve_are_done_while_a_step_is_in_its_forward(engines) -> None:
    """Forced order: the decode engine's thread is held inside a step's forward (a stream
    decoding). A COMMIT the receiver reports meanwhile is applied at once (its stream runs
    from the next step), and a Reserve, nothing queued before it, is answered meanwhile:
    neither waits for the step's end. Lifted, both streams decode to their end, the
    reservation is aborted and every block comes back."""

    async def main() -> None:
        async with cluster(*engines) as c:
            engine = engines[0]
            waiting = await c.reserve("b", list(range(60, 80)), greedy(4))
            c.receiver.release(waiting.transfer_id, "the test reports the commit itself")
            hold = ForwardHold(engine.runner)

            async def inside() -> bool:
                return hold.inside.is_set()

            async def reserved() -> int:
                return engine.remote.decode.num_reserved

            try:
                res = await c.reserve("long", PROMPT, greedy(8))
                await c.prefill_into("long", PROMPT, greedy(8), res)
                await until(inside, bool)  # its first decode step is held in the forward
                assert await reserved() == 1  # b's
                c.receiver.events.put_nowait(Committed(
                    waiting.transfer_id, tuple(waiting.block_ids), 7, 0.0))
                await until(reserved, lambda n: n == 0)  # committed beside the forward
                got = await asyncio.wait_for(c.reserve("x", list(range(100, 120)),
                                                       greedy(4)), 30)
                assert len(got.block_ids) == 2 and not hold.lift.is_set()
            finally:
                hold.lift.set()
            for rid, n in (("long", 7), ("b", 3)):
                msgs = await c.decode_all(rid)
                assert sum(len(m.token_ids) for m in msgs) == n
                assert msgs[-1].finish_reason == "length"
            assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="x"))).found
            await until(c.decode_stats, idle)

    asyncio.run(main())
