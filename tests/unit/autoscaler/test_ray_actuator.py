"""The Ray actuator's resource requests count every worker's devices: a tensor-parallel worker
of N ranks is one bundle of N GPUs (tandem up's LaunchSpec.bundle), so a scale-up asks the
cluster for room for whole groups. The pool actor is a stand-in whose calls answer as Ray's
``handle.method.remote(...)`` awaitables do; Ray's own request call is replaced by a recorder
(there is no cluster autoscaler here to ask)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tandem.autoscaler.actuators import ray_actuator
from tandem.autoscaler.actuators.ray_actuator import RayActuator
from tandem.launcher.spec import LaunchSpec


class _Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self._fn(*args)


class _Pool:
    """The pool actor's replica counts and scale calls."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = dict(counts)
        self.replicas = _Method(self._replicas)
        self.scale = _Method(self._scale)

    async def _replicas(self) -> dict[str, int]:
        return dict(self.counts)

    async def _scale(self, role: str, n: int, victims: list[str]) -> dict[str, int]:
        self.counts[role] = n
        return dict(self.counts)


def test_a_scale_up_asks_for_whole_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = LaunchSpec(insecure=True, prefill_ranks=4, decode_ranks=2, prefill_gpus=4,
                      decode_gpus=2, cpus_per_worker=1)
    asked: list[list[dict[str, float]]] = []
    monkeypatch.setattr(ray_actuator, "request_bundles", asked.append)
    pool = _Pool({"prefill": 1, "decode": 1})
    actuator = RayActuator(pool, {r: spec.bundle(r) for r in ("prefill", "decode")},
                           flips=spec.flips)
    asyncio.run(actuator.scale("decode", 3))
    (bundles,) = asked
    assert bundles == [{"CPU": 4.0, "GPU": 4.0}] + [{"CPU": 2.0, "GPU": 2.0}] * 3
    assert sum(b.get("GPU", 0) for b in bundles) == 4 * 1 + 2 * 3
    assert pool.counts == {"prefill": 1, "decode": 3} and not actuator.can_flip
