"""The pool actor (named ``tandem-registry``): starts, places, supervises and retires actors.

    start(): router actor ──> placement groups (one prefill + one decode per node) ──>
             worker actors ──> each ready (serving, registered) ──> controller (autoscale)
    router_endpoint(): how workers find the router (the "registry" in the name)
    scale(role, n, victims): add actors (spread over nodes) or retire some by draining them:
             those not serving yet, then the named victims, then the newest
    status() / down(): what runs where; drain and stop everything this pool started

A watcher per worker keeps it alive in the books: after a crash Ray restarts the actor
(``max_restarts``); the watcher calls ``ready()`` on the new incarnation, which serves and
registers again, while the router's health checks have already taken the dead endpoint out.

A tensor-parallel worker (``--tensor-parallel-size N``) is one actor too, holding all its
group's devices (``num_gpus=N``, or N ranks' CPUs: ``LaunchSpec.bundle``); rank 0 serves in
the actor and starts ranks 1..N-1 as its child processes, as ``tandem decode
--tensor-parallel-size N`` does on its own (tandem/engine/parallel/group.py):

    actor (N GPUs; CUDA_VISIBLE_DEVICES = those N) ── rank 0: gRPC, scheduler, KV endpoint
        ├── rank 1 (python -m tandem.worker.tp_rank, cuda:1) ┐ step frames over pipes,
        └── rank N-1                                         ┘ a FileStore rendezvous

Why one actor and not N one-GPU actors in a STRICT_PACK placement group (vLLM's Ray
executor): the group's steps travel over pipes and it meets in a rendezvous file, so its
ranks share a node and a parent anyway; a rank that dies ends rank 0's process
(EXIT_RANK_DIED), so the actor dies and Ray restarts the whole group, with its devices,
through the same ``max_restarts`` and watcher as any worker, where N actors would each be
restarted alone into a group that can no longer compute (its shard and KV gone) and would
need a supervisor of their own; and an actor asking for N GPUs is placed on one node or not
at all, what STRICT_PACK would give. The pair group packs such a bundle beside its partner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.launcher.argv import router_argv, served_name, worker_argv
from tandem.launcher.placement import (
    fits_one_node,
    home_strategy,
    pair_group,
    worker_resources,
    worker_strategy,
)
from tandem.launcher.spec import CONTROLLER, ROUTER, LaunchSpec, worker_name

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")
_DRAIN_WAIT_S = 180.0  # above the workers' own drain timeout (60 s by default)


@dataclass(slots=True)
class _Worker:
    role: str
    index: int
    handle: Any
    pair: int | None  # the placement group it shares with its partner, if any
    state: str = "starting"  # starting | serving | restarting | draining | dead
    info: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    watcher: asyncio.Task[None] | None = None
    flipped_to: str | None = None  # the role it serves after a flip (None: ``role``)
    flipping: bool = False

    @property
    def serves(self) -> str:
        """The role it serves now (``role``, its name's, until a flip)."""
        return self.flipped_to or self.role

    @property
    def counted(self) -> bool:
        """Whether it counts as a replica (starting and restarting ones do: they will serve)."""
        return self.state not in ("draining", "dead")


class PoolActor:
    """Everything ``tandem up`` started (wrap with ``ray.remote``; one per namespace)."""

    def __init__(self, spec: LaunchSpec, model: str, home_node: str | None = None) -> None:
        """``model``: the spec every process gets (the router reads its tokenizer, the workers
        load it). ``home_node``: the Ray node id where ``tandem up`` ran; the router and
        controller are pinned there so the printed endpoints (and a Kubernetes Service on the
        head pod) reach them."""
        self.spec = spec
        # The secrets: handed to ``start`` by a method call, never constructor arguments
        # (LaunchSpec.without_secrets); a spec that holds them (in-process use) gives them.
        self._cluster_secret = spec.cluster_secret
        self._api_keys = spec.api_keys
        self._home = home_node
        self._model = model
        self._router: Any = None
        self._router_info: dict[str, Any] = {}
        self._router_up = asyncio.Event()
        self._workers: list[_Worker] = []
        self._next = {"prefill": 0, "decode": 0}
        self._pgs: dict[int, Any] = {}
        self._controller: Any = None
        self._closing = False
        self._retiring: set[asyncio.Task[None]] = set()

    # -- start ------------------------------------------------------------------------------
    async def start(self, cluster_secret: str = "", api_keys: str = "") -> dict[str, Any]:
        """Start the router and every worker; returns ``status()`` once all serve.
        ``cluster_secret`` (hex) and ``api_keys`` (key-file text): the secrets the actors ask
        for (``cluster_secret()``, ``api_keys()``), given here rather than to the constructor
        (Ray keeps those arguments in the GCS)."""
        import ray

        from tandem.launcher.router_actor import RouterActor

        spec = self.spec
        self._cluster_secret = cluster_secret or self._cluster_secret
        self._api_keys = api_keys or self._api_keys
        if bool(self._cluster_secret) == spec.insecure:
            raise ValueError("the pool needs exactly one of a cluster secret and insecure")
        self._router = ray.remote(RouterActor).options(
            name=ROUTER, namespace=spec.namespace, num_cpus=spec.router_cpus,
            max_restarts=spec.max_restarts, max_concurrency=64,
            scheduling_strategy=home_strategy(self._home),
        ).remote(router_argv(spec, self._model), spec.namespace)
        self._router_info = await self._router.ready.remote()
        self._router_up.set()
        pairs = min(spec.prefill, spec.decode) if self._pack() else 0
        for pair in range(pairs):
            self._pgs[pair] = await pair_group(spec, pair)
        for role, count in (("decode", spec.decode), ("prefill", spec.prefill)):
            for i in range(count):
                self._add(role, pair=i if i < pairs else None)
        await self._wait_serving(spec.ready_timeout_s)
        if spec.autoscale is not None:
            from tandem.launcher.controller_actor import ControllerActor

            self._controller = ray.remote(ControllerActor).options(
                name=CONTROLLER, namespace=spec.namespace, num_cpus=0, max_restarts=-1,
                max_concurrency=16, scheduling_strategy=home_strategy(self._home),
            ).remote(spec.autoscale, spec.namespace, {r: spec.bundle(r) for r in ROLES},
                     flips=spec.flips)
            await self._controller.start.remote()
        return await self.status()

    def _pack(self) -> bool:
        """Whether to pack prefill-decode pairs: asked for, and for tensor-parallel workers
        only where a live node holds both groups' bundles (else each goes on its own)."""
        spec = self.spec
        if not spec.pack_pairs or spec.flips:  # one-rank workers: packed as always
            return spec.pack_pairs
        import ray

        nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
        if fits_one_node([spec.bundle(r) for r in ROLES], nodes):
            return True
        log.info("not packing prefill-decode pairs: no node holds a %s and a %s worker",
                 spec.bundle("prefill"), spec.bundle("decode"))
        return False

    async def router_endpoint(self) -> str:
        """The router's gRPC endpoint (waits until it serves)."""
        await self._router_up.wait()
        return str(self._router_info["grpc"])

    async def cluster_secret(self) -> str:
        """The cluster credential (hex; "" for an insecure cluster), for the actors this pool
        starts: a method call's reply goes from this actor to the caller only, where a
        constructor argument would be kept in the GCS. Anyone who may call actors in this
        namespace may call this: with Ray's token auth, only holders of the Ray token, who
        can run code on every node anyway."""
        return self._cluster_secret

    async def api_keys(self) -> str:
        """The router's API keys (key-file text; "" for none), as ``cluster_secret``."""
        return self._api_keys

    # -- scaling (the Ray actuator calls these) ----------------------------------------------
    async def replicas(self) -> dict[str, int]:
        """Workers per role that serve or will (draining and dead ones excluded)."""
        return {r: sum(1 for w in self._workers if w.serves == r and w.counted) for r in ROLES}

    async def scale(self, role: str, replicas: int, victims: Sequence[str] = ()
                    ) -> dict[str, int]:
        """Grow ``role`` to ``replicas`` (new actors spread across nodes) or shrink it by
        draining workers: those not serving yet first, then ``victims`` (worker ids, in that
        order: the autoscaler's choice, tandem/autoscaler/drains.py), then the newest. Returns the
        new counts at once (drains go on behind)."""
        if role not in ROLES or replicas < (1 if role == "decode" else 0):
            raise ValueError(f"cannot scale {role!r} to {replicas}")
        if self._closing:
            return await self.replicas()
        live = [w for w in self._workers if w.serves == role and w.counted and not w.flipping]
        for _ in range(replicas - len(live)):
            self._add(role, pair=None)
        named = {wid: i for i, wid in enumerate(victims)}

        def retire_first(w: _Worker) -> tuple[int, int]:
            if w.state != "serving":
                return (0, -w.index)  # starting or restarting: the newest first
            rank = named.get(str(w.info.get("worker_id", "")))
            return (1, rank) if rank is not None else (2, -w.index)

        live.sort(key=retire_first)
        for victim in live[:max(0, len(live) - replicas)]:
            victim.state = "draining"
            task = asyncio.create_task(self._retire(victim))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        log.info("scaled %s from %d to %d", role, len(live), replicas)
        return await self.replicas()

    async def flip(self, worker_id: str, to_role: str) -> dict[str, int]:
        """Flip the serving worker ``worker_id`` to ``to_role`` through the router (which
        moves its streams and counts it in its new pool; tandem/launcher/router_flip.py).
        It counts in ``to_role`` from the call on; a refused flip puts it back. Returns the
        new counts. Raises ValueError (no such serving worker, or a role it serves) or
        FlipFailedError (the router's reason)."""
        from tandem.launcher.router_flip import flip_via_router

        found = [w for w in self._workers if w.state == "serving"
                 and str(w.info.get("worker_id", "")) == worker_id]
        if to_role not in ROLES or not found or found[0].serves == to_role or found[0].flipping:
            raise ValueError(f"cannot flip {worker_id!r} to {to_role!r}: no serving worker "
                             "of another role by that id, or a flip of it is in progress")
        w = found[0]
        before, w.flipped_to, w.flipping = w.flipped_to, to_role, True
        try:
            await flip_via_router(await self.router_endpoint(), self._cluster_secret,
                                  worker_id, to_role)
        except BaseException:
            w.flipped_to = before
            raise
        finally:
            w.flipping = False
        log.info("flipped %s to %s", worker_name(w.role, w.index), to_role)
        return await self.replicas()

    async def targets(self) -> list[tuple[str, str, Any]]:
        """(role, gRPC endpoint, actor handle) of every serving worker, for scraping."""
        return [(w.serves, str(w.info["grpc"]), w.handle) for w in self._workers
                if w.state == "serving" and "grpc" in w.info]

    # -- status and shutdown -----------------------------------------------------------------
    async def status(self) -> dict[str, Any]:
        """The router, every worker (state, endpoint, node, registered), the autoscaler."""
        ordered = sorted(self._workers, key=lambda w: (w.role, w.index))
        fresh = await asyncio.gather(*(self._probe(w) for w in ordered))
        workers = [
            {**w.info, **now, "name": worker_name(w.role, w.index), "role": w.serves,
             "index": w.index, "state": w.state, "restarts": w.restarts, "pair": w.pair}
            for w, now in zip(ordered, fresh, strict=True)
        ]
        out: dict[str, Any] = {
            "namespace": self.spec.namespace, "pool_pid": os.getpid(),
            "router": self._router_info,
            "replicas": await self.replicas(), "workers": workers, "autoscaler": None,
        }
        if self._controller is not None:
            with contextlib.suppress(Exception):
                out["autoscaler"] = await asyncio.wait_for(
                    self._controller.summary.remote(), 5)
        return out

    async def _probe(self, w: _Worker) -> dict[str, Any]:
        """A serving worker's current registration (health) as the router sees it."""
        if w.state != "serving":
            return {"registered": False}
        try:
            return dict(await asyncio.wait_for(w.handle.info.remote(), 5))
        except Exception:  # died since: the watcher will notice and report it
            return {"registered": False}

    async def down(self) -> dict[str, Any]:
        """Drain and stop everything this pool started; returns what was stopped."""
        import ray

        self._closing = True
        stopped: list[str] = []
        if self._controller is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._controller.stop.remote(), 30)
            ray.kill(self._controller, no_restart=True)
            stopped.append(CONTROLLER)
        drained = True
        if self._router is not None:
            try:  # no new requests; those in flight finish on the workers still serving
                drained = bool(await self._router.drain.remote())
            except Exception:  # a router that is already gone has nothing in flight
                log.warning("router drain failed", exc_info=True)
        for w in self._workers:
            if w.state != "draining":
                w.state = "draining"
                task = asyncio.create_task(self._retire(w))
                self._retiring.add(task)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        stopped += [worker_name(w.role, w.index) for w in self._workers]
        self._workers.clear()
        if self._router is not None:
            ray.kill(self._router, no_restart=True)
            stopped.append(ROUTER)
        for pg in self._pgs.values():
            ray.util.remove_placement_group(pg)
        self._pgs.clear()
        return {"stopped": stopped, "drained": drained}

    # -- internals ---------------------------------------------------------------------------
    def _add(self, role: str, pair: int | None) -> _Worker:
        import ray

        from tandem.launcher.worker_actor import WorkerActor

        spec, index = self.spec, self._next[role]
        self._next[role] += 1
        strategy = worker_strategy(role, self._pgs[pair] if pair is not None else None)
        argv = worker_argv(spec, role, self._model, served_name(spec))
        handle = ray.remote(WorkerActor).options(
            name=worker_name(role, index), namespace=spec.namespace,
            **worker_resources(spec, role), max_restarts=spec.max_restarts,
            max_concurrency=64, scheduling_strategy=strategy,
        ).remote(role, index, argv, spec.namespace, spec.signal_window_s, spec.worker_host)
        worker = _Worker(role, index, handle, pair)
        worker.watcher = asyncio.create_task(self._watch(worker))
        self._workers.append(worker)
        return worker

    async def _wait_serving(self, timeout_s: float) -> None:
        """Return once every worker serves; raise ``RuntimeError`` naming the cause when one
        cannot (its error, the pool being stopped, or the time it did not report in)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not all(w.state == "serving" for w in self._workers):
            if self._closing:
                raise RuntimeError("start cancelled: the cluster is being stopped")
            failed = [w for w in self._workers if w.state == "dead"]
            if failed:
                raise RuntimeError(start_failure(failed[0]))
            if loop.time() > deadline:
                late = [w for w in self._workers if w.state != "serving"]
                raise RuntimeError(
                    f"{', '.join(worker_name(w.role, w.index) for w in late)} did not report "
                    f"in {timeout_s:g} s (still {', '.join(sorted({w.state for w in late}))})")
            await asyncio.sleep(0.1)

    async def _watch(self, w: _Worker) -> None:
        """Follow one worker for its life: ready -> serving -> (crash -> restarting -> ...).

        A call to a crashed actor fails while Ray restarts it; only failures lasting
        ``dead_after_s`` (restarts used up, or a node gone) make it ``dead``."""
        from ray.exceptions import RayActorError, RayTaskError

        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while w.counted and not self._closing:
            try:
                info = await w.handle.ready.remote(self.spec.ready_timeout_s)
                if w.info.get("worker_id") and info.get("worker_id") != w.info["worker_id"]:
                    w.restarts += 1
                    w.flipped_to = None  # a restarted worker serves its first role again
                    log.warning("%s restarted: now %s", worker_name(w.role, w.index),
                                info.get("grpc"))
                if not w.counted:
                    return
                w.info, w.state, failing_since = info, "serving", None
                while w.counted and not self._closing:
                    await asyncio.sleep(0.5)
                    await w.handle.signals.remote()  # fails once the actor dies
            except RayTaskError as exc:  # the worker could not start (bad flags, no model)
                if w.counted:
                    _mark_dead(w, _cause(exc))
                    _kill(w.handle)  # free its resources at once
                return
            except RayActorError as exc:  # the process died: Ray restarts it, or gave up
                if not w.counted:
                    return
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self.spec.dead_after_s:
                    _mark_dead(w, f"unreachable for {self.spec.dead_after_s:g} s: {_cause(exc)}")
                    return
                if w.state == "serving":
                    log.warning("%s unavailable (%s): waiting for its restart",
                                worker_name(w.role, w.index), type(exc).__name__)
                    w.state = "restarting"
                await asyncio.sleep(0.2)
            except Exception as exc:  # anything else: the supervisor cannot follow it
                log.exception("watching %s failed", worker_name(w.role, w.index))
                if w.counted:
                    _mark_dead(w, f"its supervisor failed: {_cause(exc)}")
                    _kill(w.handle)
                return

    async def _retire(self, w: _Worker) -> None:
        """Drain one worker (it finishes what it has), then end its actor for good."""
        # One that never served may still be waiting for resources: do not wait long for it.
        wait_s = _DRAIN_WAIT_S if w.info.get("worker_id") else 10.0
        try:
            await asyncio.wait_for(w.handle.drain.remote(), wait_s)
        except Exception:  # dead, stuck or never placed: nothing more to wait for
            log.warning("drain of %s failed", worker_name(w.role, w.index), exc_info=True)
        if w.watcher is not None:
            w.watcher.cancel()
        _kill(w.handle)
        if "error" not in w.info:  # dead, but not failed: say so wherever it is reported
            served = "" if w.info.get("worker_id") else " before it served"
            w.info = {**w.info, "error": f"drained and stopped by the pool{served}"}
        w.state = "dead"
        if not self._closing:
            self._workers.remove(w)
            self._release_pair(w.pair)
        log.info("retired %s", worker_name(w.role, w.index))

    def _release_pair(self, pair: int | None) -> None:
        import ray

        if pair is None or any(w.pair == pair for w in self._workers):
            return
        pg = self._pgs.pop(pair, None)
        if pg is not None:
            ray.util.remove_placement_group(pg)


def start_failure(w: _Worker) -> str:
    """Why worker ``w`` failed to start, for ``tandem up``'s error: never just "None"."""
    reason = w.info.get("error") or f"it ended in state {w.state!r} without an error"
    return f"{worker_name(w.role, w.index)} failed to start: {reason}"


def _mark_dead(w: _Worker, error: str) -> None:
    w.state, w.info = "dead", {**w.info, "error": error[:800]}


def _cause(exc: BaseException) -> str:
    """An exception as one readable line: a Ray task error by the exception it wraps."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        return _cause(cause)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kill(handle: Any) -> None:
    """End an actor for good; one already gone (or never placed) needs nothing."""
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # not an actor handle any more, or Ray already forgot it
        log.debug("ray.kill failed", exc_info=True)
