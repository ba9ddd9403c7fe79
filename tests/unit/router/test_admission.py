"""Admission by cost: the pure ledger's arithmetic and the async gate's FIFO hand-over."""

from __future__ import annotations

import asyncio

import pytest

from tandem.router.admission import AdmissionGate, AdmissionLedger, Decision
from tandem.router.cost import Cost
from tandem.router.errors import DrainingError, InvalidRequestError, OverloadedError

ONE = Cost(1, 10)


def test_ledger_run_wait_reject() -> None:
    ledger = AdmissionLedger(max_inflight=2, max_queue=1, retry_after_ms=100)
    assert ledger.decide(ONE) is Decision.RUN
    ledger.start(ONE)
    ledger.start(ONE)
    assert ledger.decide(ONE) is Decision.WAIT
    ledger.enqueue(ONE)
    assert ledger.decide(ONE) is Decision.REJECT
    err = ledger.reject()
    assert isinstance(err, OverloadedError) and err.retry_after_ms == 150 and ledger.rejected == 1
    ledger.finish(ONE)  # a slot freed with a waiter in line
    assert ledger.fits(ONE)
    ledger.promote(ONE)
    assert (ledger.running, ledger.waiting, ledger.running_tokens) == (2, 0, 20)
    ledger.finish(ONE)
    assert ledger.decide(ONE) is Decision.RUN


def test_ledger_charges_sequences_and_tokens() -> None:
    ledger = AdmissionLedger(max_inflight=8, max_queue=4, retry_after_ms=10, max_tokens=100)
    fanned = Cost(6, 30)  # one prompt of 30 tokens forked into 6 sequences
    ledger.start(fanned)
    assert (ledger.running, ledger.running_tokens) == (6, 30)
    assert ledger.decide(Cost(2, 70)) is Decision.RUN  # exactly full in both units
    assert ledger.decide(Cost(3, 1)) is Decision.WAIT  # one sequence too many
    assert ledger.decide(Cost(1, 71)) is Decision.WAIT  # one token too many
    assert ledger.decide(Cost(5, 1)) is Decision.REJECT  # more sequences than the queue holds
    ledger.enqueue(Cost(4, 1))
    assert ledger.decide(Cost(1, 1)) is Decision.REJECT  # the queue is full
    ledger.abandon(Cost(4, 1))
    ledger.finish(fanned)
    assert (ledger.running, ledger.running_tokens, ledger.waiting) == (0, 0, 0)


def test_a_cost_that_could_never_run_is_invalid_naming_the_flag() -> None:
    ledger = AdmissionLedger(max_inflight=4, max_queue=100, retry_after_ms=10, max_tokens=50)
    ledger.check(Cost(4, 50))  # the whole budget is fine
    with pytest.raises(InvalidRequestError, match=r"5 sequences \(at most 4\).*--max-inflight\)"):
        ledger.check(Cost(5, 1))
    with pytest.raises(InvalidRequestError, match=r"51 prompt tokens.*--max-inflight-tokens"):
        ledger.check(Cost(1, 51))
    AdmissionLedger(4, 100, 10, max_tokens=0).check(Cost(1, 10**9))  # 0: tokens unbounded


def test_ledger_no_queue_jumping() -> None:
    ledger = AdmissionLedger(max_inflight=1, max_queue=5, retry_after_ms=10)
    ledger.start(ONE)
    ledger.enqueue(ONE)
    ledger.finish(ONE)  # a slot is free but someone waits: newcomers queue behind
    assert ledger.decide(ONE) is Decision.WAIT


def test_gate_fifo_handover_and_drain() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(AdmissionLedger(max_inflight=1, max_queue=2, retry_after_ms=10))
        await gate.enter(ONE)
        second = asyncio.ensure_future(gate.enter(ONE))
        third = asyncio.ensure_future(gate.enter(ONE))
        await asyncio.sleep(0)
        assert gate.ledger.waiting == 2
        with pytest.raises(OverloadedError):
            await gate.enter(ONE)
        third.cancel()  # a waiter whose client left gives up its place
        with pytest.raises(asyncio.CancelledError):
            await third
        assert gate.ledger.waiting == 1
        gate.leave(ONE)
        await second
        assert (gate.ledger.running, gate.ledger.waiting) == (1, 0)
        gate.close()
        with pytest.raises(DrainingError):
            await gate.enter(ONE)
        idle = asyncio.ensure_future(gate.wait_idle())
        await asyncio.sleep(0)
        assert not idle.done()
        gate.leave(ONE)
        await idle
        assert gate.idle

    asyncio.run(scenario())


def test_gate_a_large_head_waits_for_room_and_holds_back_the_rest() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(AdmissionLedger(max_inflight=4, max_queue=8, retry_after_ms=10))
        running = [Cost(1, 0) for _ in range(3)]
        for cost in running:
            await gate.enter(cost)
        big = asyncio.ensure_future(gate.enter(Cost(4, 0)))  # needs the whole budget
        small = asyncio.ensure_future(gate.enter(Cost(1, 0)))  # would fit, but queues behind
        await asyncio.sleep(0)
        assert gate.ledger.waiting == 5 and not small.done()
        gate.leave(running[0])
        gate.leave(running[1])
        await asyncio.sleep(0)
        assert not big.done() and not small.done()  # 2 free: not enough for the head
        gate.leave(running[2])
        await big
        assert (gate.ledger.running, gate.ledger.waiting) == (4, 1)
        gate.leave(Cost(4, 0))
        await small
        gate.leave(Cost(1, 0))
        assert gate.idle

    asyncio.run(scenario())


def test_gate_a_cancelled_head_lets_the_waiters_behind_it_in() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(AdmissionLedger(max_inflight=2, max_queue=8, retry_after_ms=10))
        await gate.enter(Cost(1, 0))
        big = asyncio.ensure_future(gate.enter(Cost(2, 0)))
        small = asyncio.ensure_future(gate.enter(Cost(1, 0)))
        await asyncio.sleep(0)
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        await small  # room for it all along: only the head held it back
        assert (gate.ledger.running, gate.ledger.waiting) == (2, 0)
        with pytest.raises(InvalidRequestError):
            await gate.enter(Cost(3, 0))  # could never run: refused, not queued forever
        gate.leave(Cost(1, 0))
        gate.leave(Cost(1, 0))
        assert gate.idle

    asyncio.run(scenario())


def test_gate_a_waiter_cancelled_as_a_slot_frees_is_skipped() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(AdmissionLedger(max_inflight=1, max_queue=2, retry_after_ms=10))
        await gate.enter(ONE)
        first = asyncio.ensure_future(gate.enter(ONE))
        second = asyncio.ensure_future(gate.enter(ONE))
        await asyncio.sleep(0)
        first.cancel()  # its future is cancelled now, its task unwinds later ...
        gate.leave(ONE)  # ... so the slot goes to the next waiter
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (gate.ledger.running, gate.ledger.waiting) == (1, 0)
        gate.leave(ONE)
        assert gate.idle

    asyncio.run(scenario())
