"""The control loop: scrape every worker's Stats, decide, act, log and export.

    every interval_s:
      targets() ──Stats RPC (+ extra latency figures)──> Snapshot
      router() ──its /metrics text (TTFT, TPOT, token counters)──> Snapshot.router
      actuator.replicas() ──> current ──Autoscaler.plan──> Decisions (+ role flips, only
                                              where actuator.can_flip)
      log + export each flip and decision; actuator.flip(worker, to_role) for each flip,
      then actuator.scale(role, desired, victims) where a count changes beyond the flips

Runs inside the launcher's controller actor on Ray, or anywhere an event loop runs (the
Kubernetes actuator needs no Ray). A worker that does not answer a scrape is left out of that
snapshot; an actuator error is logged and retried at the next tick, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from tandem.autoscaler.autoscaler import Autoscaler
from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.exporter import DecisionExporter
from tandem.autoscaler.metrics import RouterSample, Snapshot, WorkerSample
from tandem.autoscaler.roles import ROLES, RoleName
from tandem.autoscaler.router_scrape import router_sample
from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import aio_interceptors
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)


class Actuator(Protocol):
    """Something that knows and changes how many replicas each role has.

    ``scale`` with fewer replicas removes the ``victims`` (worker ids) and, for the rest of
    the decrease, workers not serving yet before serving ones; an actuator that cannot
    choose (Kubernetes) removes whichever it removes.

    ``can_flip`` says whether ``flip`` works: whether a serving worker can switch roles
    without a restart (tandem/autoscaler/flips.py). The autoscaler plans flips only when it
    is true; after ``flip`` the worker counts in ``to_role`` (starting until it serves), and
    a decrease of ``to_role`` cancels workers still starting cold before it (a swap flips a
    worker in and cancels a slower cold start: tandem/autoscaler/flips.py)."""

    @property
    def can_flip(self) -> bool: ...

    async def replicas(self) -> dict[RoleName, int]: ...
    async def scale(self, role: RoleName, replicas: int,
                    victims: Sequence[str] = ()) -> None: ...
    async def flip(self, worker: str, to_role: RoleName) -> None: ...


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One worker to scrape: its gRPC endpoint and, optionally, where its latency window is."""

    role: RoleName
    endpoint: str
    extra: Callable[[], Awaitable[dict[str, Any]]] | None = None


class Controller:
    """Scrapes, decides and acts on an interval."""

    def __init__(
        self,
        config: AutoscaleConfig,
        actuator: Actuator,
        targets: Callable[[], Awaitable[list[ScrapeTarget]]],
        clock: Callable[[], float] = time.monotonic,
        rpc_timeout_s: float = 2.0,
        credential: ClusterCredential | None = None,
        router: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        """``credential``: the cluster credential the workers' Stats RPC needs (None: an
        insecure cluster); ``router``: reads the router's Prometheus text (None: no router
        figures, the policies fall back on the workers' own)."""
        self.config = config
        self.autoscaler = Autoscaler(config)
        self.exporter = DecisionExporter()
        self.decisions: list[Decision] = []  # the most recent ones, newest last
        self.changes: list[Decision] = []  # the most recent that changed a count
        self._actuator = actuator
        self._targets = targets
        self._clock = clock
        self._timeout = rpc_timeout_s
        self._router = router
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credential = credential

    def _tokens(self, endpoint: str) -> list[grpc.aio.ClientInterceptor]:
        """The cluster token on every call to the worker at ``endpoint`` (minted for it)."""
        return [] if self._credential is None else aio_interceptors(self._credential, endpoint)

    async def scrape(self) -> Snapshot:
        """One Stats call per worker, concurrently."""
        targets = await self._targets()
        samples, router = await asyncio.gather(
            asyncio.gather(*(self._sample(t) for t in targets)), self._router_sample())
        for gone in set(self._channels) - {t.endpoint for t in targets}:
            await self._channels.pop(gone).close()
        return Snapshot(self._clock(), tuple(s for s in samples if s is not None), router)

    async def _router_sample(self) -> RouterSample | None:
        if self._router is None:
            return None
        try:
            return router_sample(await asyncio.wait_for(self._router(), self._timeout))
        except Exception as exc:  # a router restarting, or an actor call failing: no figures
            log.debug("router scrape failed: %r", exc)
            return None

    async def step(self) -> list[Decision]:
        """Scrape, decide, act once; returns the decisions."""
        snap = await self.scrape()
        current = await self._actuator.replicas()
        plan = self.autoscaler.plan(snap, current, can_flip=self._actuator.can_flip)
        decisions = plan.decisions
        for f in plan.flips:
            log.info("%s", f.describe())
            self.exporter.record_flip(f)
            await self._actuator.flip(f.worker, f.target)
        for d in decisions:
            self.exporter.record(d, current[d.role])
            if d.changed:
                log.info("%s", d.describe())
            else:
                log.debug("%s", d.describe())
            if d.scales:
                await self._actuator.scale(d.role, d.desired, d.victims)
        self.decisions = (self.decisions + decisions)[-64:]
        self.changes = (self.changes + [d for d in decisions if d.changed])[-64:]
        return decisions

    async def run(self, stop: asyncio.Event) -> None:
        """``step`` every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # one bad tick (an actuator hiccup) must not end autoscaling
                log.exception("autoscaler step failed; retrying next interval")
            try:
                await asyncio.wait_for(stop.wait(), self.config.interval_s)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        """Close the scrape channels."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _sample(self, target: ScrapeTarget) -> WorkerSample | None:
        channel = self._channels.get(target.endpoint)
        if channel is None:
            channel = self._channels[target.endpoint] = grpc.aio.insecure_channel(
                target.endpoint, interceptors=self._tokens(target.endpoint))
        stub_cls = (worker_pb2_grpc.PrefillServiceStub if target.role == "prefill"
                    else worker_pb2_grpc.DecodeServiceStub)
        try:
            stats = await stub_cls(channel).Stats(worker_pb2.StatsRequest(),
                                                  timeout=self._timeout)
            extra = await asyncio.wait_for(target.extra(), self._timeout) if target.extra else {}
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("scrape %s %s failed: %s", target.role, target.endpoint, exc)
            return None
        except Exception as exc:  # the extra figures come from elsewhere (e.g. a dead actor)
            log.debug("scrape extra %s failed: %r", target.endpoint, exc)
            return None
        return sample_of(target.role, stats, extra)


def sample_of(role: RoleName, stats: worker_pb2.WorkerStats, extra: dict[str, Any]) -> WorkerSample:
    """A WorkerSample from a Stats reply and the worker's latency figures (may be empty)."""
    assert role in ROLES
    return WorkerSample(
        role=role,
        worker_id=stats.worker_id,
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        kv_cache_usage=stats.kv_cache_usage,
        draining=stats.draining,
        queued_prompt_tokens=int(extra.get("queued_prompt_tokens", 0)),
        ttft_p90_s=extra.get("ttft_p90_s"),
        itl_mean_s=extra.get("itl_mean_s"),
        prompt_tokens_total=int(extra.get("prompt_tokens_total", 0)),
        output_tokens_total=int(extra.get("output_tokens_total", 0)),
        leased_blocks=stats.num_leased_blocks,
        step_base_s=stats.step_base_s if stats.HasField("step_base_s") else None,
        step_per_row_s=stats.step_per_row_s if stats.HasField("step_per_row_s") else None,
        step_per_prefill_token_s=(stats.step_per_prefill_token_s
                                  if stats.HasField("step_per_prefill_token_s") else None),
        max_batched_tokens=stats.max_batched_tokens,
    )
