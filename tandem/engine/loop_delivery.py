"""Handing results from the engine thread to event loops, off the engine thread.

Every token a worker streams crosses from the engine thread to the asyncio loop that serves
its RPC. ``loop.call_soon_threadsafe`` does that by writing to the loop's wake-up socket,
and a system call lets go of the GIL: the loop thread, woken by that very write, takes the
GIL and runs its turn (the RPC's send, the stream's bookkeeping) while the engine thread
waits in the write to get it back. So each step's tokens cost the engine thread the loop's
whole turn before it can start the next step, and on a busy host also the wait for the loop
thread to be scheduled at all.

:class:`LoopDelivery` moves the wake-ups to a thread of their own::

    engine thread ──send(loop, fn, *args)──> [SimpleQueue] ──> delivery thread:
                    (no system call, keeps the GIL)             loop.call_soon_threadsafe(fn, *args)

``SimpleQueue.put`` wakes the delivery thread without the engine thread letting go of the
GIL, so the engine thread goes on to its next step; the delivery thread (and then the loop)
runs once the engine thread lets go of the GIL, inside the step's native call. Everything
goes through one FIFO, so a stream's outputs, a call's result and a failure reach their loop
in the order the engine thread sent them, as when it called ``call_soon_threadsafe`` itself.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class LoopDelivery:
    """One thread that calls ``loop.call_soon_threadsafe`` for the engine thread, in order."""

    def __init__(self, name: str = "loop-delivery") -> None:
        self._items: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, Callable[..., Any],
                                             tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
        """Have ``fn(*args)`` run on ``loop``, after everything sent before it."""
        self._items.put((loop, fn, args))

    def close(self) -> None:
        """Deliver what was sent, then end the thread (returns once it has)."""
        self._items.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            loop, fn, args = item
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop was closed: nobody is left to receive it
                log.debug("dropped a delivery to a closed event loop")
            except Exception:  # anything else costs that one item, never the thread
                log.exception("delivering %r to its event loop failed", fn)
