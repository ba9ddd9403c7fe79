"""Pools over time: workers start (and join after their start-up), drain, and die.

    Scale(count) up:    start count - size workers; each joins after ``startup_s``
    Scale(count) down:  starting ones are cancelled (the newest first), then the named
                        victims, then the newest running ones drain (no new work; gone
                        once its last request is done)
    Failure(index):     the index-th worker ever started in the pool dies now
    host sharing:       the i-th prefill and i-th decode worker started share a host
                        (tandem/planner/sim/host.py), paired when the second of them starts

``size`` counts workers starting or routable: draining, dead and gone ones are no longer
the pool's.
"""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.planner.profile import Profile
from tandem.planner.sim.cluster import Failure, Scale
from tandem.planner.sim.decode import DecodeWorker
from tandem.planner.sim.events import EventQueue
from tandem.planner.sim.host import HostSharing
from tandem.planner.sim.prefill import PrefillWorker
from tandem.planner.sim.router import SimRouter
from tandem.planner.sim.signals import FittedSignals

Worker = DecodeWorker | PrefillWorker


class Pools:
    """Starts workers for the router and applies Failure and Scale events."""

    def __init__(self, router: SimRouter, events: EventQueue, decode_profile: Profile,
                 prefill_profile: Profile, exact_steps: bool = False,
                 host_sharing: HostSharing | None = None, fitted: bool = False,
                 report_interval_s: float = 0.0) -> None:
        self._router = router
        self._report_s = report_interval_s  # how often a worker's queue reaches the router
        self._fitted = fitted  # each worker reports its own step-cost fit (signals.py)
        self._sharing = host_sharing
        self._events = events
        self._profiles = {Role.DECODE: decode_profile, Role.PREFILL: prefill_profile}
        self._exact = exact_steps
        self._starting: set[Worker] = set()

    def _pool(self, role: Role) -> list[Worker]:
        router = self._router
        return list(router.decode) if role is Role.DECODE else list(router.prefill)

    def size(self, role: Role) -> int:
        """Workers of ``role`` starting or taking work."""
        return sum(1 for w in self._pool(role) if w.routable or w in self._starting)

    def members(self, role: Role) -> list[Worker]:
        """The workers ``size`` counts, in start order."""
        return [w for w in self._pool(role) if w.routable or w in self._starting]

    def start(self, role: Role, startup_s: float) -> Worker:
        """A new worker of ``role``; it joins ``startup_s`` from now (0: at once)."""
        router = self._router
        profile = self._profiles[role]
        worker: Worker
        decode = role is Role.DECODE
        signals = FittedSignals(profile) if self._fitted else None
        if decode:
            worker = DecodeWorker(len(router.decode), profile, self._events, router,
                                  router.holders, self._exact, signals, self._report_s)
        else:
            worker = PrefillWorker(len(router.prefill), profile, self._events, router, signals,
                                   self._report_s)
        router.add_worker(worker)
        self._share_host(worker)
        if startup_s <= 0:
            router.join(worker)
        else:
            self._starting.add(worker)
            self._events.push(self._events.now + startup_s, self._join, worker)
        return worker

    def _share_host(self, worker: Worker) -> None:
        sharing, router = self._sharing, self._router
        if sharing is None:
            return
        i = worker.index
        if isinstance(worker, DecodeWorker):
            if i >= len(router.prefill):
                return
            prefill, decode = router.prefill[i], worker
        else:
            if i >= len(router.decode):
                return
            prefill, decode = worker, router.decode[i]
        now = self._events.now
        prefill.share_host(decode, sharing, now)
        decode.share_host(prefill, sharing.decode_factor, now)

    def _join(self, worker: Worker, _: object) -> None:
        if worker in self._starting:  # not cancelled or killed while starting
            self._starting.discard(worker)
            self._router.join(worker)

    def apply(self, event: Failure | Scale, _: object = None) -> None:
        """Handle one cluster event (an event-queue handler)."""
        if isinstance(event, Failure):
            pool = self._pool(event.role)
            if event.index < len(pool):
                worker = pool[event.index]
                if worker in self._starting:
                    self._starting.discard(worker)
                    worker.dead = True
                elif worker.routable or worker.draining:
                    self._router.kill(worker)
            return
        change = event.count - self.size(event.role)
        for _ in range(change):
            self.start(event.role, event.startup_s)
        if change >= 0:
            return
        pool = self._pool(event.role)
        named = {endpoint: i for i, endpoint in enumerate(event.victims)}
        starting = [w for w in reversed(pool) if w in self._starting]
        serving = [w for w in pool if w.routable and w not in self._starting]
        serving.sort(key=lambda w: (0, named[w.endpoint]) if w.endpoint in named
                     else (1, -w.index))
        for worker in (starting + serving)[:-change]:
            if worker in self._starting:
                self._starting.discard(worker)
                worker.draining = False
            else:
                self._router.drain(worker)
