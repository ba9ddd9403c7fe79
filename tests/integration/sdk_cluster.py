"""A real local cluster (router + prefill + decode processes) on the tiny served model
(tests/integration/served_model.py), for the SDK and client-command tests, plus the checks
those tests share: worker Stats, "everything idle and every KV block free", router metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos.tandem.v1 import worker_pb2, worker_pb2_grpc
from tandem.local_cluster import Cluster, Proc
from tests import scrape
from tests.integration.served_model import start_workers

MODEL_ID = "tiny"


@dataclass
class LocalCluster:
    """The started processes of one test module."""

    cluster: Cluster
    model: Path
    prefill: Proc
    decode: Proc
    router: Proc | None = None

    def start_router(self, *flags: str) -> Proc:
        """A router over this cluster's workers (more than one may run, e.g. with auth)."""
        return self.cluster.start(
            "router", "--port", "0", "--tokenizer", str(self.model), "--model-name", MODEL_ID,
            "--prefill", self.prefill.grpc, "--decode", self.decode.grpc, *flags,
        )

    @property
    def target(self) -> str:
        assert self.router is not None
        return self.router.grpc


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


def worker_stats(proc: Proc, role: str) -> worker_pb2.WorkerStats:
    with grpc.insecure_channel(proc.grpc) as channel:
        stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
                else worker_pb2_grpc.PrefillServiceStub)(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)


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
