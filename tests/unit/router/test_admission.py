"""Admission bookkeeping (pure) and the async gate's FIFO hand-over."""

from __future__ import annotations

import asyncio

import pytest

from tandem.router.admission import AdmissionGate, AdmissionLedger, Decision
from tandem.router.errors import DrainingError, OverloadedError


def test_ledger_run_wait_reject() -> None:
    ledger = AdmissionLedger(max_inflight=2, max_queue=1, retry_after_ms=100)
    assert ledger.decide() is Decision.RUN
    ledger.start()
    ledger.start()
    assert ledger.decide() is Decision.WAIT
    ledger.enqueue()
    assert ledger.decide() is Decision.REJECT
    err = ledger.reject()
    assert isinstance(err, OverloadedError) and err.retry_after_ms == 150 and ledger.rejected == 1
    assert ledger.finish()  # a slot freed with a waiter in line
    ledger.promote()
    assert (ledger.running, ledger.waiting) == (2, 0)
    assert not ledger.finish()
    assert ledger.decide() is Decision.RUN


def test_ledger_no_queue_jumping() -> None:
    ledger = AdmissionLedger(max_inflight=1, max_queue=5, retry_after_ms=10)
    ledger.start()
    ledger.enqueue()
    ledger.running = 0  # a slot is free but someone waits: newcomers queue behind
    assert ledger.decide() is Decision.WAIT


def test_ledger_abandon() -> None:
    ledger = AdmissionLedger(1, 1, 10)
    ledger.start()
    ledger.enqueue()
    ledger.abandon()
    assert ledger.waiting == 0 and not ledger.finish()


def test_gate_fifo_handover_and_drain() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(AdmissionLedger(max_inflight=1, max_queue=2, retry_after_ms=10))
        await gate.enter()
        second = asyncio.ensure_future(gate.enter())
        third = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        assert gate.ledger.waiting == 2
        with pytest.raises(OverloadedError):
            await gate.enter()
        third.cancel()  # a waiter whose client left gives up its place
        with pytest.raises(asyncio.CancelledError):
            await third
        assert gate.ledger.waiting == 1
        gate.leave()
        await second
        assert (gate.ledger.running, gate.ledger.waiting) == (1, 0)
        gate.close()
        with pytest.raises(DrainingError):
            await gate.enter()
        idle = asyncio.ensure_future(gate.wait_idle())
        await asyncio.sleep(0)
        assert not idle.done()
        gate.leave()
        await idle
        assert gate.idle

    asyncio.run(scenario())
