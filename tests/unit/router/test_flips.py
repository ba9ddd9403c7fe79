"""When the router refuses a role flip (tandem/router/flips.py), and the registry's side of
one: a drained worker that serves its new role is routable in the new pool only."""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.router.flips import flip_refusal
from tandem.router.membership.registry import Registry, WorkerLoad


def _registry() -> Registry:
    reg = Registry(lambda: 0.0, heartbeat_interval_s=1.0)
    for endpoint in ("p:1", "p:2"):
        reg.add_static(Role.PREFILL, endpoint)
    reg.add_static(Role.DECODE, "d:1")
    return reg


def test_a_flip_to_another_role_with_others_left_is_allowed() -> None:
    assert flip_refusal(_registry(), "p:1", Role.PREFILL, Role.DECODE, False, False) == ""


def test_refusals_say_why() -> None:
    reg = _registry()
    assert "already" in flip_refusal(reg, "d:1", Role.DECODE, Role.DECODE, True, False)
    assert "in progress" in flip_refusal(reg, "p:1", Role.PREFILL, Role.DECODE, True, True)
    last = flip_refusal(reg, "d:1", Role.DECODE, Role.PREFILL, False, False)
    assert "last routable decode worker" in last and "force" in last
    assert flip_refusal(reg, "d:1", Role.DECODE, Role.PREFILL, True, False) == ""
    reg.drain("p:2")
    assert "draining" in flip_refusal(reg, "p:2", Role.PREFILL, Role.DECODE, True, False)
    # p:2 is draining, so p:1 is the last routable prefill worker
    assert "last routable" in flip_refusal(reg, "p:1", Role.PREFILL, Role.DECODE, False, False)


def test_a_worker_that_says_it_drains_is_not_flipped() -> None:
    reg = _registry()
    reg.update_load("p:2", WorkerLoad(draining=True))
    assert "draining" in flip_refusal(reg, "p:2", Role.PREFILL, Role.DECODE, True, False)


def test_serve_as_moves_a_drained_worker_to_its_new_pool() -> None:
    reg = _registry()
    reg.update_load("p:1", WorkerLoad(num_running=3))
    reg.drain("p:1")
    assert [v.endpoint for v in reg.routable(Role.PREFILL)] == ["p:2"]
    assert reg.serve_as("p:1", Role.DECODE)
    assert [v.endpoint for v in reg.routable(Role.PREFILL)] == ["p:2"]
    decode = {v.endpoint: v for v in reg.routable(Role.DECODE)}
    assert set(decode) == {"d:1", "p:1"} and decode["p:1"].num_running == 0
    assert reg.role_of("p:1") is Role.DECODE and not reg.draining("p:1")
    assert not reg.serve_as("nobody:1", Role.DECODE)
