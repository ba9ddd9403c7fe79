"""Probes every known worker on an interval: grpc.health.v1 first, then Stats for its load.

The calls themselves are probes.py's (gRPC stays there); this module decides on their plain
answers.

A worker that fails the health check leaves the pool until a later probe passes; registered
workers silent past their heartbeat lease are forgotten (and their channels and affinity
dropped). A Stats call that fails while the health check passed leaves the worker in the
pool with its last known load: a loaded host can answer late, and a slow answer must not
look like a dead worker (a worker's Stats does not wait for its engine's current step:
tandem/engine/async_engine.py). A probe that fails after the worker registered (again) while it
ran says nothing about the registered worker and is dropped (Registry.set_healthy's
``since``): a worker that registers is routable at once.

A worker the health check cannot reach (no answer, connection refused) ``CUT_AFTER``
probes in a row, or whose lease expired while this round's probe could not reach it, has
the calls still in flight to it cut (``CutsCalls``: the handoff's in-flight tracker, wired in
by tandem/router/server.py). A partitioned worker answers nothing and closes nothing, so without
this its streams would wait for keepalive or their deadline. A worker that answers
NOT_SERVING (draining) keeps its calls: a drain finishes what it has.

A worker whose lease expired but whose health check this round answered is alive, only its
heartbeats were late (a loaded host): it leaves the pool (no new requests, its affinity
forgotten) until it registers again, which its next heartbeat does, and its calls in flight
go on over the channel they use (``_lingering``: closed once they have ended, unless it
registered again first; keepalive still bounds a call to a worker that dies meanwhile).
Cutting them would end streams that were being served.
"""

from __future__ import annotations

import asyncio
import logging

from tandem.router.membership import probes
from tandem.router.membership.registry import CutsCalls, ForgetsWorkers, NoCalls, Registry
from tandem.router.membership.worker_clients import WorkerClients

log = logging.getLogger(__name__)

# Unreachable probes in a row before a worker's calls are cut: one slow answer on a loaded
# host takes the worker out of routing, but kills no request.
CUT_AFTER = 2


class HealthMonitor:
    """Keeps the registry's health flags and loads current; cuts the calls to a worker that
    left the pool (``calls``)."""

    def __init__(
        self,
        registry: Registry,
        clients: WorkerClients,
        affinity: ForgetsWorkers,
        interval_s: float,
        timeout_s: float,
        calls: CutsCalls | None = None,
    ) -> None:
        self._registry = registry
        self._clients = clients
        self._affinity = affinity
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._calls: CutsCalls = calls if calls is not None else NoCalls()
        self._unreachable: dict[str, int] = {}  # endpoint -> failed health checks in a row
        self._lingering: set[str] = set()  # forgotten but answering: channel kept for its calls

    async def run(self, stop: asyncio.Event, probed: bool = False) -> None:
        """Probe until ``stop`` is set; ``probed``: a round just ran (the router's start awaits
        one, so that the first request finds the static workers' loads and step costs), the
        first one here waits an interval."""
        while not stop.is_set():
            if not probed:
                await self.probe_all()
            probed = False
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
            except asyncio.TimeoutError:
                continue

    async def probe_all(self) -> None:
        """One round: probe everyone, then forget the expired (see the module docstring)."""
        await asyncio.gather(*(self.probe(e) for e in self._registry.endpoints()))
        for endpoint in self._registry.expire():
            self._affinity.forget(endpoint)
            if self._unreachable.pop(endpoint, 0):
                log.warning("worker %s missed its heartbeats and cannot be reached; removed "
                            "from the pool", endpoint)
                self._cut(endpoint, "worker missed its heartbeats and cannot be reached")
                self._lingering.discard(endpoint)
                await self._clients.forget(endpoint)
            else:
                log.warning("worker %s missed its heartbeats but answers its health check: "
                            "out of the pool until it registers again; its %d calls in flight "
                            "go on", endpoint, self._calls.count(endpoint))
                self._lingering.add(endpoint)
        await self._close_lingering()

    async def _close_lingering(self) -> None:
        """Close the channel of each forgotten worker whose calls have all ended (one that
        registered again keeps it: its channel is in use again)."""
        for endpoint in list(self._lingering):
            if self._registry.role_of(endpoint) is not None:
                self._lingering.discard(endpoint)
            elif self._calls.count(endpoint) == 0:
                self._lingering.discard(endpoint)
                await self._clients.forget(endpoint)

    async def probe(self, endpoint: str) -> bool:
        """Check one worker and record the result; returns whether it is healthy."""
        role = self._registry.role_of(endpoint)
        if role is None:
            self._unreachable.pop(endpoint, None)
            return False
        generation = self._registry.generation(endpoint)
        health = await probes.check_health(self._clients, endpoint, self._timeout_s)
        problem, unreachable = health.problem, health.unreachable
        if problem is None:
            try:
                load = await probes.stats(self._clients, endpoint, role, self._timeout_s)
            except probes.StatsFailed as failed:
                if not failed.late:
                    problem = str(failed)
                # else: alive (it answered the health check) but mid-step; keep the old load
            else:
                self._registry.update_load(endpoint, load)
        # Log transitions only; a failure of a probe older than the registration is dropped.
        if self._registry.set_healthy(endpoint, problem is None, since=generation):
            if problem is None:
                log.info("worker %s is healthy again", endpoint)
            else:
                log.warning("worker %s left the pool: %s", endpoint, problem)
        if unreachable and self._registry.generation(endpoint) == generation:
            failed = self._unreachable[endpoint] = self._unreachable.get(endpoint, 0) + 1
            if failed >= CUT_AFTER:
                self._cut(endpoint, f"{failed} probes could not reach it: {problem}")
        else:
            self._unreachable.pop(endpoint, None)
        return problem is None

    def _cut(self, endpoint: str, why: str) -> None:
        cut = self._calls.cancel(endpoint, f"worker left the pool: {why}")
        if cut:
            log.warning("cut %d calls in flight to %s", cut, endpoint)
