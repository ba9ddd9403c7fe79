"""Kubernetes discovery against an API server double speaking the real list/watch protocol.

The real ``kubernetes`` client talks HTTP to ``KubeApiDouble``; membership lands in a real
``Registry``. Pods appear, become ready, go not-ready, are deleted; a 410 forces a relist and
a 500 a retry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tandem.common.security.credential import ClusterCredential, new_secret
from tandem.common.security.grpc_auth import (
    ClusterAuthInterceptor,
    aio_interceptors,
    worker_audience,
)
from tandem.common.wire import parse_ready_line
from tandem.placement.affinity import PrefixAffinity
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2_grpc
from tandem.router.cli import build_parser, config_from_args
from tandem.router.membership.k8s_discovery import (
    DEFAULT_SELECTOR,
    DiscoveryConfig,
    KubernetesDiscovery,
    RegistrySink,
)
from tandem.router.membership.k8s_pods import Membership, PodTracker, pod_state
from tandem.router.membership.member_proof import MemberProver
from tandem.router.membership.registry import Registry
from tandem.router.membership.worker_clients import WorkerClients
from tandem.worker.membership import MembershipServicer
from tests.unit.router.fakes import CREDENTIAL, SECRET_FILE
from tests.unit.router.kube_api import KubeApiDouble, make_pod


@pytest.fixture
def api() -> Iterator[KubeApiDouble]:
    double = KubeApiDouble().start()
    yield double
    double.close()


class Pool:
    """A registry fed by discovery, plus a way to wait on its state. By default its router
    runs ``--insecure`` (nothing to prove: these tests are about the watch protocol);
    ``credential`` makes every pod prove membership first."""

    def __init__(self, credential: ClusterCredential | None = None) -> None:
        credential = credential or ClusterCredential.insecure_default()
        self.registry = Registry(time.monotonic, heartbeat_interval_s=1.0)
        self.clients = WorkerClients(interceptors=lambda e: aio_interceptors(credential, e))
        self.affinity = PrefixAffinity(64)
        self.sink = RegistrySink(self.registry, self.clients, self.affinity,
                                 prover=MemberProver(self.clients, credential),
                                 min_retry_s=0.05, max_retry_s=0.2)
        self.applied: list[Membership] = []

    async def apply(self, change: Membership) -> None:
        self.applied.append(change)
        await self.sink.apply(change)

    def members(self, role: Role) -> set[str]:
        return {w.endpoint for w in self.registry.routable(role)}

    async def wait_for(self, cond: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.registry.endpoints()}")
            await asyncio.sleep(0.01)


Scenario = Callable[[Pool, KubernetesDiscovery], Awaitable[None]]


def run(api: KubeApiDouble, scenario: Scenario,
        credential: ClusterCredential | None = None) -> None:
    """Run ``scenario`` on a fresh loop with discovery pointed at ``api``; always stop it."""

    async def main() -> None:
        state = Pool(credential)
        discovery = KubernetesDiscovery(
            DiscoveryConfig(namespace="tandem", watch_timeout_s=30, min_backoff_s=0.05),
            k8s.ApiClient(k8s.Configuration(host=api.url)),
            state.apply,
        )
        try:
            await scenario(state, discovery)
        finally:
            await asyncio.wait_for(discovery.stop(), timeout=10)
            await state.sink.close()
            await state.clients.close()

    asyncio.run(main())


def test_pods_join_when_ready_and_leave_when_not(api: KubeApiDouble) -> None:
    async def scenario(state: Pool, discovery: KubernetesDiscovery) -> None:
        api.put(make_pod("prefill-0", "prefill", ip="10.0.0.1", ready=True))
        api.put(make_pod("decode-0", "decode"))  # pending: no IP yet
        api.put(make_pod("other", "router", ip="10.0.0.9", ready=True))  # not selected
        await discovery.start()
        await state.wait_for(lambda: state.members(Role.PREFILL) == {"10.0.0.1:7000"}, "prefill")
        assert state.members(Role.DECODE) == set()
        assert api.requests[0]["labelSelector"] == [DEFAULT_SELECTOR]

        # Scheduled and running, but not ready yet: still out.
        api.put(make_pod("decode-0", "decode", ip="10.0.0.2", port=7100))
        await state.wait_for(lambda: api.watchers() >= 1, "a watch")
        api.put(make_pod("decode-0", "decode", ip="10.0.0.2", port=7100, ready=True))
        await state.wait_for(lambda: state.members(Role.DECODE) == {"10.0.0.2:7100"}, "decode")
        assert state.registry.role_of("10.0.0.2:7100") is Role.DECODE

        # A second prefill pod whose port comes from the annotation.
        api.put(make_pod("prefill-1", "prefill", ip="10.0.0.3", ready=True, port=7300,
                         annotate_port=True))
        await state.wait_for(lambda: len(state.members(Role.PREFILL)) == 2, "second prefill")
        assert "10.0.0.3:7300" in state.members(Role.PREFILL)

        # NotReady (e.g. draining): leaves routing at once, but its channel is kept.
        state.clients.decode("10.0.0.2:7100")
        api.put(make_pod("decode-0", "decode", ip="10.0.0.2", port=7100, ready=False))
        await state.wait_for(lambda: state.registry.role_of("10.0.0.2:7100") is None, "not ready")
        assert state.applied[-1].gone == []

        # Deleted: gone for good.
        api.delete("decode-0")
        await state.wait_for(lambda: "10.0.0.2:7100" in state.applied[-1].gone, "deleted")
        assert state.members(Role.DECODE) == set()
        assert state.members(Role.PREFILL) == {"10.0.0.1:7000", "10.0.0.3:7300"}

        # Terminating (deletionTimestamp set) is out even while the Ready condition lingers.
        api.put(make_pod("prefill-1", "prefill", ip="10.0.0.3", ready=True, port=7300,
                         annotate_port=True, deleting=True))
        await state.wait_for(lambda: state.members(Role.PREFILL) == {"10.0.0.1:7000"}, "terminating")

    run(api, scenario)


def test_410_gone_relists_and_catches_up(api: KubeApiDouble) -> None:
    async def scenario(state: Pool, discovery: KubernetesDiscovery) -> None:
        api.put(make_pod("prefill-0", "prefill", ip="10.0.0.1", ready=True))
        await discovery.start()
        await state.wait_for(lambda: state.members(Role.PREFILL) == {"10.0.0.1:7000"}, "first list")
        await state.wait_for(lambda: api.watchers() >= 1, "a watch")
        assert discovery.relists == 1

        # A change whose event was compacted away: no watch can deliver it, a relist must.
        api.put(make_pod("decode-0", "decode", ip="10.0.0.2", ready=True), compacted=True)
        api.expire_watches()  # the open watch ends with an ERROR 410 event
        await state.wait_for(lambda: state.members(Role.DECODE) == {"10.0.0.2:7000"}, "relist")
        assert discovery.relists == 2
        # The new watch resumes from the relist's resourceVersion and sees later changes.
        api.delete("prefill-0")
        await state.wait_for(lambda: state.members(Role.PREFILL) == set(), "prefill gone")
        watches = [q for q in api.requests if q.get("watch") == ["true"]]
        assert int(watches[-1]["resourceVersion"][0]) > int(watches[0]["resourceVersion"][0])

    run(api, scenario)


def test_api_errors_back_off_and_recover(api: KubeApiDouble) -> None:
    async def scenario(state: Pool, discovery: KubernetesDiscovery) -> None:
        api.fail_next = [500, 503]
        api.put(make_pod("decode-0", "decode", ip="10.0.0.2", ready=True))
        await discovery.start()
        await state.wait_for(lambda: state.members(Role.DECODE) == {"10.0.0.2:7000"}, "recovery")
        assert len(api.requests) >= 3 and discovery.relists == 1

    run(api, scenario)


def test_stop_ends_an_open_watch(api: KubeApiDouble) -> None:
    async def scenario(state: Pool, discovery: KubernetesDiscovery) -> None:
        await discovery.start()
        await state.wait_for(lambda: api.watchers() >= 1, "a watch")
        await asyncio.wait_for(discovery.stop(), timeout=5)

    run(api, scenario)


def test_pod_state_reads_role_endpoint_and_readiness() -> None:
    ready = pod_state(make_pod("p", "prefill", ip="10.1.1.1", ready=True, port=9))
    assert ready is not None and ready.ready and ready.endpoint == "10.1.1.1:9"
    assert ready.role is Role.PREFILL
    pending = pod_state(make_pod("d", "decode"))
    assert pending is not None and not pending.ready and pending.endpoint is None
    assert pod_state(make_pod("r", "router", ip="10.1.1.2", ready=True)) is None
    deleting = pod_state(make_pod("d", "decode", ip="10.1.1.3", ready=True, deleting=True))
    assert deleting is not None and not deleting.ready


def test_tracker_announces_a_role_change_as_leave_then_join() -> None:
    tracker = PodTracker("grpc")
    first = tracker.replace([make_pod("a", "prefill", ip="10.0.0.1", ready=True)])
    assert first.joined == [(Role.PREFILL, "10.0.0.1:7000")] and not first.left
    assert not tracker.event("MODIFIED", make_pod("a", "prefill", ip="10.0.0.1", ready=True))
    # The same IP:port reused by a decode pod (a new pod after the old one went).
    swap = tracker.replace([make_pod("b", "decode", ip="10.0.0.1", ready=True)])
    assert swap.left == ["10.0.0.1:7000"] and swap.joined == [(Role.DECODE, "10.0.0.1:7000")]


def test_router_flags_select_kubernetes_discovery(tmp_path: pytest.TempPathFactory) -> None:
    args = build_parser().parse_args([
        "--tokenizer", str(tmp_path), "--max-model-len", "64", "--discovery", "kubernetes",
        "--k8s-namespace", "serving", "--k8s-selector", "app.kubernetes.io/component=decode",
    ])
    config = config_from_args(args)
    assert (config.discovery, config.k8s_namespace) == ("kubernetes", "serving")
    assert config.k8s_selector == "app.kubernetes.io/component=decode"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tokenizer", "x", "--discovery", "dns"])


def test_router_process_watches_pods_and_drains(api: KubeApiDouble, tmp_path: Path) -> None:
    """``python -m tandem.router --discovery kubernetes``: reaches the API through a kubeconfig,
    lists and watches worker pods with its selector, and still exits 0 on SIGTERM."""
    from tandem.engine.loader import resolve_model

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": api.url}}],
        "users": [{"name": "test", "user": {"token": "t"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "test"}}],
    }))
    api.put(make_pod("decode-0", "decode", ip="127.0.0.1", ready=True, port=1))
    selector = "app.kubernetes.io/instance=tandem,app.kubernetes.io/component in (prefill,decode)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.router", "--port", "0", "--http-port", "0",
         "--tokenizer", str(resolve_model("smollm2")), "--log-level", "WARNING",
         "--discovery", "kubernetes", "--k8s-namespace", "tandem", "--k8s-selector", selector,
         "--cluster-secret-file", str(SECRET_FILE)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[4],  # the repository root
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert parse_ready_line(line) is not None, line + (proc.stderr.read() if proc.stderr else "")
        deadline = time.monotonic() + 20
        while api.watchers() < 1:
            assert time.monotonic() < deadline, api.requests
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        assert api.requests[0]["labelSelector"] == [selector]
        assert "watch" not in api.requests[0]  # LIST first, then WATCH from its version
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_departed_pod_has_its_calls_cut_before_its_channel_closes() -> None:
    order: list[str] = []

    class Calls:
        def cancel(self, endpoint: str, reason: str) -> int:
            order.append(f"cut {endpoint}: {reason}")
            return 1

    class Clients(WorkerClients):
        async def forget(self, endpoint: str) -> None:
            order.append(f"close {endpoint}")

    registry = Registry(time.monotonic, heartbeat_interval_s=1.0)
    clients = Clients()
    sink = RegistrySink(registry, clients, PrefixAffinity(64), Calls(),
                        prover=MemberProver(clients, ClusterCredential.insecure_default()))

    async def main() -> None:
        await sink.apply(Membership(joined=[(Role.DECODE, "10.0.0.7:50051")]))
        while registry.role_of("10.0.0.7:50051") is None:  # admitted (nothing to prove)
            await asyncio.sleep(0.01)
        await sink.apply(Membership(left=["10.0.0.7:50051"], gone=["10.0.0.7:50051"]))

    asyncio.run(main())
    assert order == ["cut 10.0.0.7:50051: its pod left the pool", "close 10.0.0.7:50051"]
    assert registry.role_of("10.0.0.7:50051") is None


async def _member_server(credential: ClusterCredential, role: str) -> tuple[object, int]:
    """A worker's gRPC port as far as membership goes: its interceptor and its Membership
    service (what tandem/worker/process.py serves), holding ``credential``."""
    import grpc

    auth = ClusterAuthInterceptor(credential)
    server = grpc.aio.server(interceptors=[auth])
    port = server.add_insecure_port("127.0.0.1:0")
    audience = worker_audience("127.0.0.1", port)
    auth.answer_to(audience)
    worker_pb2_grpc.add_MembershipServicer_to_server(
        MembershipServicer(credential, role, audience), server)
    await server.start()
    return server, port


def test_discovered_pods_get_traffic_only_once_they_prove_membership(
        api: KubeApiDouble, caplog: pytest.LogCaptureFixture) -> None:
    """Three Ready pods with the right labels: a worker holding the cluster secret joins; one
    holding another cluster's secret, and a decode worker labelled prefill, never do (each
    is logged with why) however long discovery keeps trying."""
    stranger = ClusterCredential.from_hex(new_secret())

    async def scenario(state: Pool, discovery: KubernetesDiscovery) -> None:
        member, member_port = await _member_server(CREDENTIAL, "prefill")
        impostor, impostor_port = await _member_server(stranger, "prefill")
        mislabelled, mislabelled_port = await _member_server(CREDENTIAL, "decode")
        try:
            for name, port in (("member", member_port), ("impostor", impostor_port),
                               ("mislabelled", mislabelled_port)):
                api.put(make_pod(name, "prefill", ip="127.0.0.1", ready=True, port=port))
            await discovery.start()
            good = f"127.0.0.1:{member_port}"
            bad = {f"127.0.0.1:{impostor_port}", f"127.0.0.1:{mislabelled_port}"}
            await state.wait_for(lambda: state.members(Role.PREFILL) == {good}, "the member")
            await state.wait_for(lambda: set(state.sink.refused) == bad, "both refusals")
            attempts = caplog.text.count(f"127.0.0.1:{impostor_port} is not routed")
            await state.wait_for(  # tried again, and still out
                lambda: caplog.text.count(f"127.0.0.1:{impostor_port} is not routed") > attempts,
                "a second attempt")
            assert state.members(Role.PREFILL) == {good}
            assert state.registry.count(Role.PREFILL) == 1
            assert "UNAUTHENTICATED" in state.sink.refused[f"127.0.0.1:{impostor_port}"]
            assert "answers as a decode worker" in state.sink.refused[
                f"127.0.0.1:{mislabelled_port}"]
            # the impostor's pod goes: its admission stops, nothing is left behind
            api.delete("impostor")
            await state.wait_for(
                lambda: f"127.0.0.1:{impostor_port}" not in state.sink.refused, "its removal")
        finally:
            for server in (member, impostor, mislabelled):
                await server.stop(0)  # type: ignore[attr-defined]

    with caplog.at_level(logging.WARNING, logger="tandem.router.membership.k8s_discovery"):
        run(api, scenario, CREDENTIAL)
