"""tandem/engine/loop_delivery.py: the engine thread's hand-overs reach their loops in the
order sent, all of them before ``close`` returns, and a closed loop costs nothing."""

from __future__ import annotations

import asyncio
import threading

from tandem.engine.loop_delivery import LoopDelivery


def test_items_from_another_thread_arrive_in_order_on_each_loop() -> None:
    async def main() -> tuple[list[int], list[int]]:
        delivery = LoopDelivery()
        loop = asyncio.get_running_loop()
        got: list[int] = []
        other_got: list[int] = []
        other = asyncio.new_event_loop()
        runner = threading.Thread(target=other.run_forever)
        runner.start()
        done = asyncio.Event()

        def engine_thread() -> None:  # the sender is a thread of its own, as the engine's
            for i in range(2000):
                delivery.send(loop, got.append, i)
                delivery.send(other, other_got.append, i)
            delivery.send(loop, done.set)

        t = threading.Thread(target=engine_thread)
        t.start()
        await done.wait()
        t.join()
        delivery.close()
        other.call_soon_threadsafe(other.stop)
        runner.join()
        other.close()
        return got, other_got

    got, other_got = asyncio.run(main())
    assert got == list(range(2000))
    assert other_got == list(range(2000))  # close delivered every item sent before it


def test_close_delivers_what_was_sent_then_ends_the_thread() -> None:
    loop = asyncio.new_event_loop()
    try:
        delivery = LoopDelivery(name="test-delivery")
        got: list[str] = []
        delivery.send(loop, got.append, "a")
        delivery.send(loop, got.append, "b")
        delivery.close()
        assert not any(t.name == "test-delivery" for t in threading.enumerate())
        loop.call_soon(loop.stop)
        loop.run_forever()  # the callbacks were queued on the loop before close returned
        assert got == ["a", "b"]
    finally:
        loop.close()


def test_a_closed_loop_drops_its_items_and_the_others_still_arrive() -> None:
    closed = asyncio.new_event_loop()
    closed.close()
    live = asyncio.new_event_loop()
    try:
        delivery = LoopDelivery()
        got: list[int] = []
        delivery.send(closed, got.append, 1)
        delivery.send(live, got.append, 2)
        delivery.close()
        live.call_soon(live.stop)
        live.run_forever()
        assert got == [2]
    finally:
        live.close()
