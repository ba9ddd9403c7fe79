"""Pools over time: workers start (and join after their start-up), drain, and die.

    Scale(count) up:    start count - size workers; each joins after ``startup_s``
    Scale(count) down:  starting ones are cancelled (the newest first, flipping ones
                        last), then the named victims, then the newest running ones drain
                        (no new work; gone once its last request is done)
    Failure(index):     the index-th worker ever started in the pool dies now
    RoleFlip(index):    the index-th worker switches roles (flip): a new worker of the other
                        role starts (counted in that pool at once); a prefill worker
                        drains its queue first, a decode worker's streams move at once
                        (router.move_streams); ``flip_s`` after it is empty the new one joins
    host sharing:       the i-th prefill and i-th decode worker started share a host
                        (tandem/planner/sim/host.py), paired when the second of them starts

``size`` counts workers starting or routable: draining, dead and gone ones are no longer
the pool's.
"""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.planner.profile import Profile
from tandem.planner.sim.cluster import ClusterError, Failure, RoleFlip, Scale
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
        self._successor: dict[Worker, tuple[Worker, float]] = {}  # flipping: (new, flip_s)
        self._flipping_in: set[Worker] = set()  # successors not joined yet
        router.on_left = self._left

    def _pool(self, role: Role) -> list[Worker]:
        router = self._router
        return list(router.decode) if role is Role.DECODE else list(router.prefill)

    def size(self, role: Role) -> int:
        """Workers of ``role`` starting or taking work."""
        return sum(1 for w in self._pool(role) if w.routable or w in self._starting)

    def members(self, role: Role) -> list[Worker]:
        """The workers ``size`` counts, in start order."""
        return [w for w in self._pool(role) if w.routable or w in self._starting]

    def start(self, role: Role, startup_s: float | None) -> Worker:
        """A new worker of ``role``; it joins ``startup_s`` from now (0: at once; None:
        when a flip's worker is free, :meth:`flip`)."""
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
        if startup_s is not None and startup_s <= 0:
            router.join(worker)
        else:
            self._starting.add(worker)
            if startup_s is not None:
                self._events.push(self._events.now + startup_s, self._join, worker)
        return worker

    def flip(self, worker: Worker, flip_s: float) -> Worker:
        """``worker`` (routable) switches roles: the worker that stands for it in the other
        pool, which joins ``flip_s`` after ``worker`` is empty."""
        if self._sharing is not None:
            raise ClusterError("role flips are not simulated with host sharing")
        if not worker.routable:
            raise ClusterError(f"{worker.endpoint} does not serve: it cannot flip")
        decode = isinstance(worker, DecodeWorker)
        new = self.start(Role.PREFILL if decode else Role.DECODE, None)
        self._successor[worker] = (new, flip_s)
        self._flipping_in.add(new)
        if isinstance(worker, DecodeWorker):
            self._router.move_streams(worker)
            self._left(worker)
        else:
            self._router.drain(worker)  # finishes its queued prompts; _left when empty
        return new

    def _left(self, worker: Worker) -> None:
        """A worker is empty and gone from its pool: a flip's successor joins after the
        flip time."""
        entry = self._successor.pop(worker, None)
        if entry is not None:
            new, flip_s = entry
            self._events.push(self._events.now + flip_s, self._join, new)

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
        self._flipping_in.discard(worker)
        if worker in self._starting:  # not cancelled or killed while starting
            self._starting.discard(worker)
            self._router.join(worker)

    def apply(self, event: Failure | Scale | RoleFlip, _: object = None) -> None:
        """Handle one cluster event (an event-queue handler)."""
        if isinstance(event, RoleFlip):
            pool = self._pool(event.role)
            if event.index < len(pool) and pool[event.index].routable:
                self.flip(pool[event.index], event.flip_s)
            return
        if isinstance(event, Failure):
            pool = self._pool(event.role)
            if event.index < len(pool):
                worker = pool[event.index]
                if worker in self._starting:
                    self._starting.discard(worker)
                    worker.dead = True
                elif worker.routable or worker.draining:
                    self._router.kill(worker)
                    flipping = self._successor.pop(worker, None)
                    if flipping is not None:  # its GPUs are gone: no flip to finish
                        self._starting.discard(flipping[0])
                        flipping[0].dead = True
            return
        change = event.count - self.size(event.role)
        for _ in range(change):
            self.start(event.role, event.startup_s)
        if change >= 0:
            return
        pool = self._pool(event.role)
        named = {endpoint: i for i, endpoint in enumerate(event.victims)}
        # Cold-starting workers before flipped ones (which serve sooner), newest first.
        starting = sorted((w for w in reversed(pool) if w in self._starting),
                          key=lambda w: w in self._flipping_in)
        serving = [w for w in pool if w.routable and w not in self._starting]
        serving.sort(key=lambda w: (0, named[w.endpoint]) if w.endpoint in named
                     else (1, -w.index))
        for worker in (starting + serving)[:-change]:
            if worker in self._starting:
                self._starting.discard(worker)
                worker.draining = False
            else:
                self._router.drain(worker)
