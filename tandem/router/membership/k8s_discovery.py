"""Worker discovery through the Kubernetes API: Ready worker pods join the pool, others leave.

The ``deployments`` mode of the Helm chart runs workers as plain pods; the router finds them by
label instead of by flags. The Kubernetes watch protocol, run in a worker thread so the
blocking client never stalls the router's event loop::

    LIST pods?labelSelector=S            -> full state, resourceVersion RV
    WATCH pods?labelSelector=S&rv=RV     -> ADDED / MODIFIED / DELETED / BOOKMARK, RV advances
       stream ends (server timeout)      -> WATCH again from the last RV
       410 Gone (RV too old)             -> LIST again (relist), then WATCH
       any other error                   -> back off (doubling, capped), then LIST again

After every change the thread diffs the pods' state against what it last announced and hands
the router's loop three lists: endpoints that joined (Ready, an IP, a gRPC port, not being
deleted), endpoints that left (removed from routing at once: no new work), and endpoints whose
pod is gone entirely (only then is the channel closed, so a draining pod's streams finish).

A pod that joined is routed to only once it has proven it holds the cluster credential
(member_proof.py: a challenge answered with an HMAC); labels and readiness are claims anyone
who can create a pod can make. Until then it is out of the pool; a failed proof is logged and
tried again with backoff (doubling, capped) for as long as the pod stays Ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from urllib3.exceptions import HTTPError

from tandem.placement.worker_view import Role
from tandem.router.membership.k8s_pods import Membership, PodTracker
from tandem.router.membership.registry import CutsCalls, ForgetsWorkers, NoCalls, Registry
from tandem.router.membership.worker_clients import WorkerClients

log = logging.getLogger(__name__)

DEFAULT_SELECTOR = "app.kubernetes.io/component in (prefill,decode)"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """Which pods to watch and how patiently.

    A pod's gRPC port is its ``tandem.dev/grpc-port`` annotation, else the container port
    named ``grpc``. ``watch_timeout_s`` is the server-side ``timeoutSeconds`` of one watch.
    """

    namespace: str
    selector: str = DEFAULT_SELECTOR
    port_name: str = "grpc"
    watch_timeout_s: int = 60
    min_backoff_s: float = 0.2
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("discovery needs a namespace")
        if self.watch_timeout_s < 1 or not 0 < self.min_backoff_s <= self.max_backoff_s:
            raise ValueError("invalid discovery timing")


class Prover(Protocol):
    """What checks a discovered worker's membership (member_proof.MemberProver)."""

    async def prove(self, role: Role, endpoint: str) -> str | None:
        """None when proven; else why not."""


class RegistrySink:
    """Applies membership changes to the router's registry, affinity map and channels.

    Runs on the router's event loop. Discovered workers enter as static entries (they are
    never expired for missing heartbeats: the pod's readiness decides), once ``prover``
    says they hold the credential. ``calls``: the handoff's in-flight tracker, whose calls
    to a departed pod are cut before its channel closes.
    """

    def __init__(
        self,
        registry: Registry,
        clients: WorkerClients,
        affinity: ForgetsWorkers,
        calls: CutsCalls | None = None,
        *,
        prover: Prover,
        min_retry_s: float = 0.5,
        max_retry_s: float = 30.0,
    ) -> None:
        self._registry = registry
        self._clients = clients
        self._affinity = affinity
        self._calls: CutsCalls = calls if calls is not None else NoCalls()
        self._prover = prover
        self._retry = (min_retry_s, max_retry_s)
        self._proving: dict[str, asyncio.Task[None]] = {}  # endpoint -> its admission
        self.refused: dict[str, str] = {}  # endpoint -> why its last proof failed

    async def apply(self, change: Membership) -> None:
        """Left before joined: a pod whose endpoint changed role leaves, then joins again."""
        for endpoint in change.left:
            self._stop_proving(endpoint)
            if self._registry.remove(endpoint):
                log.info("worker %s left the pool (pod not ready or deleted)", endpoint)
            self._affinity.forget(endpoint)
        for role, endpoint in change.joined:
            if self._registry.role_of(endpoint) is None and endpoint not in self._proving:
                task = asyncio.get_running_loop().create_task(self._admit(role, endpoint))
                self._proving[endpoint] = task
                task.add_done_callback(lambda t, e=endpoint: self._done(e, t))
        for endpoint in change.gone:
            self._stop_proving(endpoint)
            # Cut its calls first: they fail as a worker failure (the request migrates or
            # retries) rather than as a bare cancellation when the channel closes under them.
            self._calls.cancel(endpoint, "its pod left the pool")
            await self._clients.forget(endpoint)

    async def _admit(self, role: Role, endpoint: str) -> None:
        """Prove ``endpoint``, then add it; again with backoff until it proves or leaves."""
        delay, cap = self._retry
        while True:
            why = await self._prover.prove(role, endpoint)
            if why is None:
                self.refused.pop(endpoint, None)
                if self._registry.role_of(endpoint) is None:
                    self._registry.add_static(role, endpoint)
                    log.info("%s worker %s joined the pool (pod ready, membership proven)",
                             role.value, endpoint)
                return
            self.refused[endpoint] = why
            log.warning("%s pod at %s is not routed: it did not prove cluster membership (%s);"
                        " trying again in %.1fs", role.value, endpoint, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)

    def _done(self, endpoint: str, task: asyncio.Task[None]) -> None:
        if self._proving.get(endpoint) is task:
            del self._proving[endpoint]
        if not task.cancelled() and task.exception() is not None:
            log.error("admitting %s failed", endpoint, exc_info=task.exception())

    def _stop_proving(self, endpoint: str) -> None:
        task = self._proving.pop(endpoint, None)
        if task is not None:
            task.cancel()
        self.refused.pop(endpoint, None)

    async def close(self) -> None:
        """Stop every admission in progress."""
        tasks = list(self._proving.values())
        self._proving.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class KubernetesDiscovery:
    """List + watch worker pods in a thread; apply each change on the event loop."""

    def __init__(
        self,
        config: DiscoveryConfig,
        api_client: k8s.ApiClient,
        apply: Callable[[Membership], Any],
    ) -> None:
        self.config = config
        self._api = k8s.CoreV1Api(api_client)
        self._apply = apply  # an async function, called on the loop
        self._halt = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_task: asyncio.Future[None] | None = None
        self._tracker = PodTracker(config.port_name)  # touched only by the watch thread
        self.relists = 0  # LISTs done (the first one included): tests watch 410 handling

    async def start(self) -> None:
        """Begin listing and watching in a background thread."""
        self._loop = asyncio.get_running_loop()
        self._thread_task = asyncio.ensure_future(asyncio.to_thread(self._run))

    async def stop(self) -> None:
        """Stop watching and wait for the thread to end."""
        self._halt.set()
        task = self._thread_task
        while task is not None and not task.done():
            # Again until the thread ends: a watch whose connection was still opening at the
            # first stop() has no socket to shut yet, and would block until its timeout.
            watch = self._watch
            if watch is not None:
                watch.stop()  # shuts the socket: unblocks a read in progress
            await asyncio.wait([task], timeout=0.05)
        if task is not None:
            with contextlib.suppress(Exception):
                await task

    def _run(self) -> None:
        backoff = self.config.min_backoff_s
        while not self._halt.is_set():
            try:
                version = self._relist()
                backoff = self.config.min_backoff_s
                while not self._halt.is_set():
                    version = self._watch_once(version)
            except k8s.ApiException as err:
                if self._halt.is_set():
                    return
                if err.status == 410:
                    log.info("pod watch expired (410 Gone): listing again")
                    continue
                log.warning("kubernetes API error %s (%s); retrying in %.1fs",
                            err.status, err.reason, backoff)
            except (HTTPError, OSError, ValueError) as err:
                if self._halt.is_set():
                    return
                log.warning("kubernetes API unreachable (%s); retrying in %.1fs", err, backoff)
            except Exception:  # an unexpected reply must not end discovery for the router's life
                if self._halt.is_set():
                    return
                log.exception("pod discovery failed; retrying in %.1fs", backoff)
            self._halt.wait(backoff)
            backoff = min(backoff * 2, self.config.max_backoff_s)

    def _relist(self) -> str:
        resp = self._api.list_namespaced_pod(
            self.config.namespace,
            label_selector=self.config.selector,
            _preload_content=False,
            _request_timeout=self.config.watch_timeout_s,
        )
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        self.relists += 1
        self._emit(self._tracker.replace(body.get("items") or []))
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _watch_once(self, version: str) -> str:
        """One watch request from ``version``; returns the last version seen."""
        self._watch = watch = k8s_watch.Watch()
        timeout = self.config.watch_timeout_s
        stream = watch.stream(
            self._api.list_namespaced_pod,
            self.config.namespace,
            label_selector=self.config.selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,  # also turns off the client's own 410 retry: we relist
            _request_timeout=timeout + 10,
        )
        for event in stream:
            if self._halt.is_set():
                break
            kind = event["type"]
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._emit(self._tracker.event(kind, event["raw_object"]))
            version = watch.resource_version or version
        return version

    def _emit(self, change: Membership) -> None:
        if change and self._loop is not None and not self._halt.is_set():
            asyncio.run_coroutine_threadsafe(self._apply(change), self._loop)


def namespace_or_own(namespace: str) -> str:
    """``namespace`` or, when empty, the pod's own (from its service account mount)."""
    if namespace:
        return namespace
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def api_client_from_environment() -> k8s.ApiClient:
    """An API client for in-cluster use (service account), else from ~/.kube/config."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()
