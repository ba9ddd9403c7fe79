"""Which failed worker call takes its worker out of the pool: the marking rule.

    failure of a data-path call (Reserve, Prefill, PrefillLocal, Decode)   the worker
    ----------------------------------------------------------------------------------------
    UNAVAILABLE from the worker or the channel to it (refused, reset,      leaves the pool
      unreachable; a worker draining or whose engine stopped says so too)
    cut by the health monitor (it already took the worker out)            (already out)
    the router's own bound ran out (a slow call: Fault.SLOW)               stays
    a prefill worker's receiver failed (Fault.RECEIVER): the prefill       stays (and so does
      worker is fine, the decode worker's fate is the health monitor's      the decode worker)
    anything else (full, a bad request, an error of that one request)      stays

A worker that leaves the pool comes back when a health probe passes
(tandem/router/membership/health_monitor.py); only those probes, and a channel that fails,
decide that a worker is gone. A slow call is a failure of its request, which is retried
elsewhere within the request's own deadline: one request that is slow to serve (a grammar
that takes long to compile, a long queue) must never take a healthy worker out of the pool
for every other request. A prefill worker whose push failed because its decode worker died,
was drained or cannot be reached says so with a typed reason (tandem/worker/errors.py,
``fault`` trailer); the leg moves to another decode worker and the prefill worker keeps
serving.
"""

from __future__ import annotations

from tandem.router.errors import Fault, WorkerCallError


def takes_out_of_pool(err: WorkerCallError) -> bool:
    """Whether ``err`` says its worker is gone (see the module docstring)."""
    return err.code_name == "UNAVAILABLE" and err.fault is Fault.WORKER


def receiver_lost(err: WorkerCallError) -> bool:
    """Whether a prefill call failed because the decode worker it pushed to failed: the leg
    is lost, not the prefill worker."""
    return err.fault is Fault.RECEIVER


def slow(err: WorkerCallError) -> bool:
    """Whether the call ran out the router's own bound (not the client's deadline)."""
    return err.fault is Fault.SLOW
