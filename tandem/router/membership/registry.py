"""The worker registry: who is in the pool, how loaded, and when they were last heard from.

Two ways in: a static list from flags (never forgotten; out of the pool while unhealthy) and
workers that Register themselves (forgotten after ``missed_heartbeats`` intervals of silence).
A worker is routable when it is healthy and not draining. Time comes from an injected clock so
expiry is tested without sleeping.

A worker that registers is routable at once, whatever was said of it before: its entry is
new (healthy), and a health probe that began before the registration cannot take it out of
the pool when it fails (``generation``/``set_healthy(since=...)``: it probed the process
that was still loading, or the one that went away). ``watch`` callbacks run after any
change that can change what is routable (what the router's readiness follows).

Heartbeats keep a worker known and carry its load, but never make it healthy: they travel
worker -> router, and a worker whose heartbeats arrive may still be one the router cannot
reach (a one-way partition). Only a passing health probe (``set_healthy(..., True)``) or a
fresh registration clears an unhealthy mark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tandem.placement.worker_view import Role, WorkerView


class ForgetsWorkers(Protocol):
    """What remembers workers by endpoint beyond the registry (the handoff's prefix-affinity
    map): told when a worker leaves the pool, so nothing routes to it from memory.

    A protocol, so membership never imports the handoff package that owns the map.
    """

    def forget(self, endpoint: str) -> None:
        """Drop everything remembered about ``endpoint``."""


class CutsCalls(Protocol):
    """What holds the router's calls in flight by endpoint (the handoff's tracker, told to
    cut the calls to a worker that left the pool); a protocol for the same reason."""

    def cancel(self, endpoint: str, reason: str) -> int:
        """Cut every call in flight to ``endpoint``; returns how many were cut."""

    def count(self, endpoint: str) -> int:
        """Calls in flight to ``endpoint``."""


class NoCalls:
    """The null tracker: nothing to cut."""

    def cancel(self, endpoint: str, reason: str) -> int:
        """Nothing is in flight here."""
        return 0

    def count(self, endpoint: str) -> int:
        """Nothing is in flight here."""
        return 0


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """Load figures a worker reports (a transport-free copy of the WorkerStats message)."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0
    draining: bool = False
    # The placement model's inputs (WorkerView has the meanings; None: not observed yet).
    step_base_s: float | None = None
    step_per_row_s: float | None = None
    step_per_prefill_token_s: float | None = None
    queued_prefill_tokens: int = 0
    max_batched_tokens: int = 0
    cached_blocks: frozenset[int] = frozenset()  # prefix-cache hashes it holds
    weights_format: str = ""  # how it holds the model's weights ("" until reported)
    loras: frozenset[str] = frozenset()  # the LoRA adapters it serves (name@digest each)


@dataclass(slots=True)
class _Entry:
    worker_id: str
    role: Role
    endpoint: str
    static: bool
    last_seen: float
    load: WorkerLoad
    healthy: bool = True
    active: int = 0
    prefilling_tokens: int = 0  # prompt tokens of this router's prefills running there now
    generation: int = 0  # bumped by every (re)registration of this endpoint
    # an operator drains it: no new work until it registers again or comes back healthy
    # after it was out of the pool (the drained process exited; a new one answers there)
    drain_asked: bool = False
    move_streams: bool = False  # and its decode streams move live, new ones as they start


class Registry:
    """Pool membership and load of every known worker, keyed by gRPC endpoint."""

    def __init__(
        self,
        clock: Callable[[], float],
        heartbeat_interval_s: float,
        missed_heartbeats: int = 3,
    ) -> None:
        self._clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self._ttl = heartbeat_interval_s * missed_heartbeats
        self._by_endpoint: dict[str, _Entry] = {}
        self._endpoint_of: dict[str, str] = {}  # worker_id -> endpoint
        self._generation = 0
        # Requests still on workers forgotten by ``expire`` (their calls may go on): carried
        # into the entry when the worker registers again, so ``release`` balances.
        self._carried_active: dict[str, int] = {}
        self._watchers: list[Callable[[], None]] = []

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every change that can change what is routable."""
        self._watchers.append(callback)

    def _changed(self) -> None:
        for callback in self._watchers:
            callback()

    def add_static(self, role: Role, endpoint: str) -> None:
        """Add a worker named on the command line; it stays known for the router's life."""
        self._by_endpoint[endpoint] = _Entry(
            endpoint, role, endpoint, static=True, last_seen=self._clock(), load=WorkerLoad()
        )
        self._endpoint_of[endpoint] = endpoint
        self._changed()

    def register(self, role: Role, endpoint: str, worker_id: str = "") -> str:
        """A worker joined (or rejoined); returns its worker id (its endpoint when empty).

        It is healthy from now on, whatever a probe said of the endpoint before."""
        worker_id = worker_id or endpoint
        old = self._by_endpoint.get(endpoint)
        if old is not None:
            self._endpoint_of.pop(old.worker_id, None)
        self._generation += 1
        entry = _Entry(
            worker_id,
            role,
            endpoint,
            static=old.static if old is not None else False,
            last_seen=self._clock(),
            load=WorkerLoad(),
            active=old.active if old is not None else self._carried_active.pop(endpoint, 0),
            generation=self._generation,
        )
        self._by_endpoint[endpoint] = entry
        self._endpoint_of[worker_id] = endpoint
        self._changed()
        return worker_id

    def generation(self, endpoint: str) -> int:
        """Which registration of ``endpoint`` is current (pass it to ``set_healthy``)."""
        entry = self._by_endpoint.get(endpoint)
        return entry.generation if entry is not None else -1

    def heartbeat(self, worker_id: str, load: WorkerLoad | None) -> bool:
        """Record a heartbeat (it renews the lease and the load, never the health flag: see
        the module docstring); False when the worker is unknown and must register again."""
        entry = self._entry_by_id(worker_id)
        if entry is None:
            return False
        before = _routable(entry)
        entry.last_seen = self._clock()
        if load is not None:
            entry.load = load
        if _routable(entry) != before:
            self._changed()
        return True

    def update_load(self, endpoint: str, load: WorkerLoad) -> None:
        """Record load polled from the worker's Stats (only heartbeats keep a worker known)."""
        entry = self._by_endpoint.get(endpoint)
        if entry is not None:
            before = _routable(entry)
            entry.load = load
            if _routable(entry) != before:
                self._changed()

    def set_healthy(self, endpoint: str, healthy: bool, since: int | None = None) -> bool:
        """Record a health-check result (or a failed call: False takes it out of the pool);
        returns whether that changed the worker's state.

        ``since``: the ``generation`` when the check began; a failure from before the
        worker's latest registration is stale and ignored."""
        entry = self._by_endpoint.get(endpoint)
        if entry is None or entry.healthy == healthy:
            return False
        if not healthy and since is not None and since != entry.generation:
            return False
        entry.healthy = healthy
        if healthy:  # back after it was gone: a drained worker's new process takes work
            entry.drain_asked = entry.move_streams = False
        self._changed()
        return True

    def expire(self) -> list[str]:
        """Forget registered workers silent for too long; returns the forgotten endpoints.

        The router's requests still counted on one carry over to its next registration."""
        now = self._clock()
        gone = [
            e.endpoint
            for e in self._by_endpoint.values()
            if not e.static and now - e.last_seen > self._ttl
        ]
        for endpoint in gone:
            entry = self._by_endpoint.pop(endpoint)
            self._endpoint_of.pop(entry.worker_id, None)
            if entry.active:
                self._carried_active[endpoint] = entry.active
        if gone:
            self._changed()
        return gone

    def remove(self, endpoint: str) -> bool:
        """Forget a worker, static or not (discovery saw its pod go); False if unknown."""
        entry = self._by_endpoint.pop(endpoint, None)
        if entry is None:
            return False
        self._endpoint_of.pop(entry.worker_id, None)
        self._changed()
        return True

    def acquire(self, endpoint: str) -> None:
        """The router put one request on ``endpoint``."""
        entry = self._by_endpoint.get(endpoint)
        if entry is not None:
            entry.active += 1

    def release(self, endpoint: str) -> None:
        """One of the router's requests left ``endpoint``."""
        entry = self._by_endpoint.get(endpoint)
        if entry is not None and entry.active > 0:
            entry.active -= 1
        elif entry is None and endpoint in self._carried_active:
            self._carried_active[endpoint] -= 1
            if not self._carried_active[endpoint]:
                del self._carried_active[endpoint]

    def prefilling(self, endpoint: str, tokens: int) -> None:
        """This router's prefills on ``endpoint`` gained (``tokens`` > 0) or lost prompt
        tokens: a prefill there started or ended."""
        entry = self._by_endpoint.get(endpoint)
        if entry is not None:
            entry.prefilling_tokens = max(entry.prefilling_tokens + tokens, 0)

    def drain(self, endpoint: str, move_streams: bool = False) -> bool:
        """Send ``endpoint`` no new work from now on (an operator's drain), whatever its
        heartbeats say, until it registers again or is healthy again after it was out of the
        pool (``move_streams``: its decode streams are to move live meanwhile, those that
        start decoding there later too); False when unknown."""
        entry = self._by_endpoint.get(endpoint)
        if entry is None:
            return False
        entry.drain_asked = True
        entry.move_streams = entry.move_streams or move_streams
        self._changed()
        return True

    def serve_as(self, endpoint: str, role: Role) -> bool:
        """``endpoint`` serves ``role`` from now on and takes work again (a role flip ended,
        or was refused and the old role goes on); its old role's load is forgotten until
        its next heartbeat. False when unknown."""
        entry = self._by_endpoint.get(endpoint)
        if entry is None:
            return False
        entry.role = role
        entry.drain_asked = entry.move_streams = False
        entry.load = WorkerLoad()
        entry.prefilling_tokens = 0
        self._changed()
        return True

    def draining(self, endpoint: str) -> bool:
        """Whether ``endpoint`` is being drained (an operator asked, or it says so)."""
        entry = self._by_endpoint.get(endpoint)
        return entry is not None and (entry.drain_asked or entry.load.draining)

    def moving_off(self, endpoint: str) -> bool:
        """Whether the decode streams on ``endpoint`` are to move live (a drain with
        migrate)."""
        entry = self._by_endpoint.get(endpoint)
        return entry is not None and entry.drain_asked and entry.move_streams

    def endpoint_of(self, worker: str) -> str | None:
        """The endpoint of a worker named by its endpoint or its worker id; None: unknown."""
        if worker in self._by_endpoint:
            return worker
        return self._endpoint_of.get(worker)

    def endpoints(self) -> list[str]:
        """Every known endpoint, routable or not (what the health monitor probes)."""
        return list(self._by_endpoint)

    def routable(self, role: Role) -> list[WorkerView]:
        """Snapshots of the healthy, non-draining workers of ``role``."""
        return [
            _view(e)
            for e in self._by_endpoint.values()
            if e.role is role and _routable(e)
        ]

    def count(self, role: Role) -> int:
        """Known workers of ``role``, routable or not."""
        return sum(1 for e in self._by_endpoint.values() if e.role is role)

    def role_of(self, endpoint: str) -> Role | None:
        """The role of a known worker."""
        entry = self._by_endpoint.get(endpoint)
        return entry.role if entry is not None else None

    def view(self, endpoint: str) -> WorkerView | None:
        """A snapshot of one worker, routable or not."""
        entry = self._by_endpoint.get(endpoint)
        return _view(entry) if entry is not None else None

    def _entry_by_id(self, worker_id: str) -> _Entry | None:
        endpoint = self._endpoint_of.get(worker_id)
        return self._by_endpoint.get(endpoint) if endpoint is not None else None


def _routable(e: _Entry) -> bool:
    return e.healthy and not e.load.draining and not e.drain_asked


def _view(e: _Entry) -> WorkerView:
    return WorkerView(
        e.endpoint,
        e.role,
        num_running=e.load.num_running,
        num_waiting=e.load.num_waiting,
        num_free_blocks=e.load.num_free_blocks,
        num_blocks=e.load.num_blocks,
        active=e.active,
        step_base_s=e.load.step_base_s,
        step_per_row_s=e.load.step_per_row_s,
        step_per_prefill_token_s=e.load.step_per_prefill_token_s,
        # the worker's report, or this router's own prefills there, whichever is larger
        # (the report is a heartbeat old; the router's count is exact but only its own)
        queued_prefill_tokens=max(e.load.queued_prefill_tokens, e.prefilling_tokens),
        max_batched_tokens=e.load.max_batched_tokens,
        cached_blocks=e.load.cached_blocks,
        weights_format=e.load.weights_format,
        loras=e.load.loras,
    )
