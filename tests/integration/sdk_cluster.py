"""A real local cluster (router + prefill + decode processes) on the tiny served model
(tests/integration/served_model.py), for the SDK and client-command tests, plus the checks
those tests share: worker Stats, "everything idle and every KV block free", router metrics,
and pausing a worker so that a stream it feeds cannot end while a test acts on it."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tests import scrape
from tests.integration.served_model import TinyWorkers, start_workers

MODEL_ID = "tiny"


@dataclass(frozen=True)
class RouterAccess:
    """A started router and what reading its /metrics takes (its TLS CA and an API key when
    its edge has them)."""

    proc: Proc
    ca: Path | None = None
    api_key: str | None = None

    def metrics(self) -> scrape.Samples:
        return scrape.parse(scrape.fetch(self.proc.info["http"], ca=self.ca, api_key=self.api_key))


@dataclass
class LocalCluster:
    """The started processes of one test module."""

    cluster: Cluster
    model: Path
    prefill: Proc
    decode: Proc
    router: Proc | None = None
    routers: list[RouterAccess] = field(default_factory=list)  # every router over the workers

    def start_router(self, *flags: str, ca: Path | None = None,
                     api_key: str | None = None) -> Proc:
        """A router over this cluster's workers (more than one may run, e.g. with auth);
        ``ca`` and ``api_key``: what reading its metrics takes when ``flags`` secure its edge."""
        proc = self.cluster.start(
            "tandem.router", "--port", "0", "--tokenizer", str(self.model), "--model-name", MODEL_ID,
            "--prefill", self.prefill.grpc, "--decode", self.decode.grpc,
            "--placement", "remote",  # the disaggregated path every time, not by timing
            *flags,
        )
        self.routers.append(RouterAccess(proc, ca, api_key))
        return proc

    @property
    def target(self) -> str:
        assert self.router is not None
        return self.router.grpc

    @contextmanager
    def paused_decode(self) -> Iterator[None]:
        """The decode worker paused for the block (see ``paused``), every router routing to
        it again after."""
        with paused(self.decode, "decode", self.routers):
            yield


def start_cluster(model: Path, *router_flags: str) -> LocalCluster:
    """Decode and prefill workers, then a router over both (serving model id ``tiny``)."""
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model)
        local = LocalCluster(c, model, prefill, decode)
        local.router = local.start_router(*router_flags)
        return local
    except BaseException:
        c.stop()
        raise


def start_router_on(workers: TinyWorkers, *router_flags: str) -> LocalCluster:
    """A router of its own over the session's shared tiny workers (tests/integration/
    conftest.py): ``cluster`` holds only the routers, so stopping it leaves the workers."""
    c = Cluster(credential_flags=workers.cluster.credential_flags)
    try:
        local = LocalCluster(c, workers.model, workers.prefill, workers.decode)
        local.router = local.start_router(*router_flags)
        return local
    except BaseException:
        c.stop()
        raise


def worker_stats(proc: Proc, role: str) -> worker_pb2.WorkerStats:
    with proc.channel() as channel:
        stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
                else worker_pb2_grpc.PrefillServiceStub)(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


def lora_holders(router: Proc, role: str, adapter: str) -> float:
    """Routable workers of ``role`` the router has seen serving LoRA ``adapter`` (its
    ``tandem_lora_adapter_workers`` gauge; 0 before any report of it)."""
    samples = scrape.parse(scrape.fetch(router.info["http"]))
    try:
        return scrape.value(samples, "tandem_lora_adapter_workers", worker_role=role,
                            adapter=adapter)
    except KeyError:
        return 0.0


def worker_idle(proc: Proc, role: str) -> bool:
    """Whether ``proc`` runs, waits for and reserves nothing and has every KV block free."""
    st = worker_stats(proc, role)
    return (st.num_running == st.num_waiting == st.num_reserved == st.num_leased_blocks == 0
            and st.num_free_blocks == st.num_blocks)


def idle_problems(local: LocalCluster) -> list[str]:
    """What still holds work or KV blocks on the workers (empty: all free)."""
    problems = []
    for role, proc in (("prefill", local.prefill), ("decode", local.decode)):
        st = worker_stats(proc, role)
        if st.num_running or st.num_waiting or st.num_reserved:
            problems.append(f"{role}: running={st.num_running} waiting={st.num_waiting} "
                            f"reserved={st.num_reserved}")
        if st.num_free_blocks != st.num_blocks:
            problems.append(f"{role}: {st.num_blocks - st.num_free_blocks} blocks in use")
        if st.num_leased_blocks:
            problems.append(f"{role}: {st.num_leased_blocks} blocks leased")
    return problems


def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``cond`` until true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)  # polling a condition, not waiting a fixed time


@contextmanager
def paused(worker: Proc, role: str, routers: Sequence[RouterAccess]) -> Iterator[None]:
    """``worker`` stopped (SIGSTOP) for the block and resumed (SIGCONT) on every way out.

    While it is stopped nothing it serves progresses, so a stream it feeds cannot end on its
    own, whatever the machine's load: the ordering a test needs is forced, not hoped for. After
    a clean exit the block also waits until every router in ``routers`` has the worker in its
    pool again (a health probe that timed out during the pause takes it out until the next one
    passes)."""
    worker.popen.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        worker.popen.send_signal(signal.SIGCONT)
    wait_routed(routers, role)


def wait_routed(routers: Sequence[RouterAccess], role: str, timeout: float = 60.0) -> None:
    """Wait until each router has every known ``role`` worker in its pool (routable)."""
    def routed() -> bool:
        return all(scrape.value(r.metrics(), "tandem_workers", worker_role=role,
                                routable="false") == 0 for r in routers)

    try:
        wait_until(routed, timeout)
    except TimeoutError:
        raise AssertionError(f"a {role} worker stayed out of a router's pool") from None


def assert_idle(local: LocalCluster, timeout: float = 60.0) -> None:
    """Wait until both workers hold no request and no KV block (cancels land asynchronously)."""
    try:
        wait_until(lambda: not idle_problems(local), timeout)
    except TimeoutError:
        raise AssertionError(f"workers not idle: {idle_problems(local)}") from None


def requests_with_outcome(router: Proc, outcome: str) -> float:
    """The router's ``tandem_requests_total`` for one outcome (ok, cancelled, ...)."""
    samples = scrape.parse(scrape.fetch(router.info["http"]))
    return scrape.value(samples, "tandem_requests_total", outcome=outcome)
