"""Registry membership, heartbeat expiry (fake clock) and load bookkeeping."""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.router.membership.registry import Registry, WorkerLoad


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _endpoints(reg: Registry, role: Role) -> list[str]:
    return sorted(w.endpoint for w in reg.routable(role))


def test_static_workers_are_routable_and_never_expire() -> None:
    clock = FakeClock()
    reg = Registry(clock, heartbeat_interval_s=1.0, missed_heartbeats=3)
    reg.add_static(Role.PREFILL, "p:1")
    reg.add_static(Role.DECODE, "d:1")
    clock.now += 1e6
    assert reg.expire() == []
    assert _endpoints(reg, Role.PREFILL) == ["p:1"] and _endpoints(reg, Role.DECODE) == ["d:1"]


def test_registered_worker_expires_after_missed_heartbeats() -> None:
    clock = FakeClock()
    reg = Registry(clock, heartbeat_interval_s=1.0, missed_heartbeats=3)
    assert reg.register(Role.DECODE, "d:2", "w2") == "w2"
    clock.now += 2.5
    assert reg.heartbeat("w2", WorkerLoad(num_running=4))
    clock.now += 3.0  # exactly the lease: still known
    assert reg.expire() == []
    assert reg.routable(Role.DECODE)[0].num_running == 4
    clock.now += 0.01
    assert reg.expire() == ["d:2"]
    assert reg.routable(Role.DECODE) == []
    assert not reg.heartbeat("w2", None)  # unknown: the worker must register again


def test_register_without_id_uses_endpoint_and_reregister_replaces() -> None:
    reg = Registry(FakeClock(), 1.0)
    assert reg.register(Role.PREFILL, "p:9") == "p:9"
    reg.register(Role.PREFILL, "p:9", "new-id")
    assert not reg.heartbeat("p:9", None) and reg.heartbeat("new-id", None)
    assert _endpoints(reg, Role.PREFILL) == ["p:9"]


def test_registering_a_static_endpoint_keeps_it_static() -> None:
    clock = FakeClock()
    reg = Registry(clock, 1.0)
    reg.add_static(Role.DECODE, "d:1")
    reg.register(Role.DECODE, "d:1", "w1")
    clock.now += 100
    assert reg.expire() == [] and _endpoints(reg, Role.DECODE) == ["d:1"]


def test_unhealthy_and_draining_workers_leave_the_pool() -> None:
    reg = Registry(FakeClock(), 1.0)
    reg.add_static(Role.DECODE, "a")
    reg.add_static(Role.DECODE, "b")
    reg.set_healthy("a", False)
    reg.update_load("b", WorkerLoad(draining=True))
    assert reg.routable(Role.DECODE) == []
    reg.set_healthy("a", True)
    assert _endpoints(reg, Role.DECODE) == ["a"]
    assert sorted(reg.endpoints()) == ["a", "b"]  # still probed


def test_polled_stats_do_not_keep_a_silent_worker_alive() -> None:
    clock = FakeClock()
    reg = Registry(clock, 1.0, missed_heartbeats=2)
    reg.register(Role.PREFILL, "p", "p")
    clock.now += 5
    reg.update_load("p", WorkerLoad(num_waiting=1))
    reg.set_healthy("p", True)
    assert reg.expire() == ["p"]


def test_acquire_release_counts_active_requests() -> None:
    reg = Registry(FakeClock(), 1.0)
    reg.add_static(Role.PREFILL, "p")
    reg.acquire("p")
    reg.acquire("p")
    reg.release("p")
    assert reg.view("p").active == 1  # type: ignore[union-attr]
    reg.release("p")
    reg.release("p")  # never negative
    reg.release("unknown")
    assert reg.view("p").active == 0  # type: ignore[union-attr]
    assert reg.role_of("p") is Role.PREFILL and reg.role_of("x") is None


def test_register_clears_an_unhealthy_mark_and_outdates_older_probes() -> None:
    reg = Registry(FakeClock(), 1.0)
    reg.add_static(Role.DECODE, "d")
    reg.set_healthy("d", False)  # its first probe timed out while it loaded its model
    assert reg.routable(Role.DECODE) == []
    probe_began = reg.generation("d")  # a probe starts ...
    reg.register(Role.DECODE, "d", "w")  # ... the worker registers: routable at once
    assert _endpoints(reg, Role.DECODE) == ["d"]
    assert not reg.set_healthy("d", False, since=probe_began)  # ... the old probe fails: stale
    assert _endpoints(reg, Role.DECODE) == ["d"]
    assert reg.set_healthy("d", False, since=reg.generation("d"))  # a current one counts
    assert reg.routable(Role.DECODE) == []


def test_watchers_hear_every_change_of_what_is_routable() -> None:
    clock = FakeClock()
    reg = Registry(clock, 1.0, missed_heartbeats=1)
    calls: list[int] = []
    reg.watch(lambda: calls.append(len(reg.routable(Role.DECODE))))
    reg.register(Role.DECODE, "d", "w")
    reg.heartbeat("w", WorkerLoad())  # nothing routable changed: no call
    reg.update_load("d", WorkerLoad(draining=True))
    reg.heartbeat("w", WorkerLoad())  # no longer draining
    reg.set_healthy("d", False)
    reg.set_healthy("d", True)
    clock.now += 5
    reg.expire()
    assert calls == [1, 0, 1, 0, 1, 0]
    assert reg.count(Role.DECODE) == 0



def test_heartbeats_never_make_an_unhealthy_worker_healthy() -> None:
    """A one-way partition: the worker's heartbeats reach the router, the router's probes
    do not reach the worker. Heartbeats keep it known (and its load current) but only a
    passing probe or a fresh registration puts it back in the pool."""
    clock = FakeClock()
    reg = Registry(clock, heartbeat_interval_s=1.0, missed_heartbeats=3)
    reg.register(Role.DECODE, "d:1", "w1")
    assert reg.set_healthy("d:1", False)  # a probe could not reach it
    for _ in range(10):
        clock.now += 1.0
        assert reg.heartbeat("w1", WorkerLoad(num_running=2))
    assert reg.routable(Role.DECODE) == []  # still out of the pool ...
    assert reg.expire() == []  # ... but its lease is current
    assert reg.view("d:1").num_running == 2  # type: ignore[union-attr]
    assert reg.set_healthy("d:1", True)  # a probe passed
    assert _endpoints(reg, Role.DECODE) == ["d:1"]
    reg.set_healthy("d:1", False)
    reg.register(Role.DECODE, "d:1", "w1")  # a fresh registration clears it as well
    assert _endpoints(reg, Role.DECODE) == ["d:1"]


def test_router_prefills_count_toward_queued_prompt_tokens() -> None:
    """The view's queued prompt tokens: the worker's report or this router's own prefills
    there, whichever is larger (the report lags; the router's count is exact)."""
    reg = Registry(FakeClock(), 1.0)
    reg.add_static(Role.PREFILL, "p")
    reg.update_load("p", WorkerLoad(queued_prefill_tokens=100))
    reg.prefilling("p", 300)
    reg.prefilling("p", 50)
    assert reg.view("p").queued_prefill_tokens == 350  # type: ignore[union-attr]
    reg.prefilling("p", -350)
    assert reg.view("p").queued_prefill_tokens == 100  # type: ignore[union-attr]
    reg.prefilling("p", -5)  # never negative
    reg.prefilling("unknown", 10)
    assert reg.view("p").queued_prefill_tokens == 100  # type: ignore[union-attr]


def test_reported_cached_blocks_reach_the_view() -> None:
    reg = Registry(FakeClock(), 1.0)
    reg.add_static(Role.DECODE, "d")
    reg.update_load("d", WorkerLoad(cached_blocks=frozenset({7, 8})))
    assert reg.view("d").cached_blocks == {7, 8}  # type: ignore[union-attr]


def test_an_operators_drain_holds_until_the_worker_comes_back() -> None:
    clock = FakeClock()
    reg = Registry(clock, heartbeat_interval_s=1.0, missed_heartbeats=3)
    reg.add_static(Role.DECODE, "d:1")
    reg.register(Role.DECODE, "d:2", "w2")
    assert reg.endpoint_of("w2") == "d:2" and reg.endpoint_of("d:1") == "d:1"
    assert reg.endpoint_of("nobody") is None and not reg.drain("nobody:1")
    assert reg.drain("d:1") and reg.drain("d:2", move_streams=True)
    assert _endpoints(reg, Role.DECODE) == []
    assert not reg.moving_off("d:1") and reg.moving_off("d:2")
    assert reg.heartbeat("w2", WorkerLoad(draining=False))  # a beat sent before it was told
    assert _endpoints(reg, Role.DECODE) == []
    reg.set_healthy("d:1", False)  # the drained process exited ...
    reg.set_healthy("d:1", True)  # ... and a new one answers at its address
    reg.register(Role.DECODE, "d:2", "w2b")  # a new process registered there
    assert _endpoints(reg, Role.DECODE) == ["d:1", "d:2"] and not reg.moving_off("d:2")
