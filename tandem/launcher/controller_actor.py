"""The autoscaler's controller as a Ray actor (named ``tandem-controller``).

Builds ``tandem.autoscaler.controller.Controller`` with a ``RayActuator`` over the pool actor and
scrapes the pool's serving workers (their Stats RPC plus each worker actor's latency window)
and the router actor's metrics (TTFT and TPOT as clients see them, token counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict
from typing import Any

from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.controller import Controller, ScrapeTarget
from tandem.common.security.credential import ClusterCredential

log = logging.getLogger(__name__)


class ControllerActor:
    """Runs the control loop until ``stop`` (wrap with ``ray.remote``)."""

    def __init__(self, config: AutoscaleConfig, namespace: str,
                 bundles: dict[str, dict[str, float]], flips: bool = True) -> None:
        """``bundles``: one worker's Ray resources per role (a tensor-parallel worker's
        holds all its ranks' devices); ``flips``: whether the workers can switch roles (a
        tensor-parallel group keeps its role: tandem/worker/dual/app.py)."""
        self._flips = flips
        self._config = config
        self._namespace = namespace
        self._bundles = bundles
        self._controller: Controller | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Start the loop (idempotent); serve metrics when the config names a port."""
        if self._task is not None:
            return
        import ray

        from tandem.autoscaler.actuators.ray_actuator import RayActuator
        from tandem.launcher.spec import REGISTRY, ROUTER

        logging.basicConfig(level=logging.INFO)
        pool = ray.get_actor(REGISTRY, namespace=self._namespace)
        actuator = RayActuator(pool, self._bundles, self._config.request_resources,
                               flips=self._flips)

        async def targets() -> list[ScrapeTarget]:
            found = await pool.targets.remote()
            return [ScrapeTarget(role, endpoint, handle.signals.remote)
                    for role, endpoint, handle in found]

        router = ray.get_actor(ROUTER, namespace=self._namespace)  # a restart keeps the handle

        async def router_metrics() -> str:
            return str(await router.metrics_text.remote())

        # The credential from the pool (a method call's reply; never a constructor argument,
        # which Ray keeps in the GCS).
        secret = await pool.cluster_secret.remote()  # hex; "" for an insecure cluster
        credential = (ClusterCredential.from_hex(secret) if secret
                      else ClusterCredential.insecure_default())
        self._controller = Controller(self._config, actuator, targets, credential=credential,
                                      router=router_metrics)
        if self._config.metrics_port:
            self._controller.exporter.serve(self._config.metrics_port)
        self._task = asyncio.create_task(self._controller.run(self._stop))

    async def summary(self) -> dict[str, Any]:
        """The policy and the latest decision per role, with their inputs."""
        if self._controller is None:
            return {"policy": self._config.policy, "decisions": []}
        latest = {d.role: d for d in self._controller.decisions}
        return {"policy": self._config.policy,
                "decisions": [asdict(d) for d in latest.values()]}

    async def decisions(self, changes_only: bool = False) -> list[dict[str, Any]]:
        """Recent decisions, newest last (``changes_only``: those that changed a count)."""
        if self._controller is None:
            return []
        found = self._controller.changes if changes_only else self._controller.decisions
        return [asdict(d) for d in found]

    async def metrics_text(self) -> str:
        """The Prometheus exposition of the decision metrics."""
        return self._controller.exporter.text() if self._controller else ""

    async def stop(self) -> None:
        """End the loop and close scrape channels."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._controller is not None:
            await self._controller.close()
        if self._config.request_resources:  # withdraw the standing request for nodes
            from tandem.autoscaler.actuators.ray_actuator import request_bundles

            await asyncio.to_thread(request_bundles, [])
