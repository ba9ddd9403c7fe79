"""The KV path between the prefill worker and a decode worker partitioned while a request's
KV is being pushed (real processes, the tiny served model): the request completes on the
other decode worker with transformers' greedy output, no worker leaves the router's pool
(the prefill worker is blamed for nothing: its receiver stopped answering), and once the
partition heals every KV block on the partitioned decode worker is free.

    decode D1: KV on 127.0.0.1:Q1, advertises 127.0.0.2 (--kv-advertise-host), TCP only
    decode D2: KV on 127.0.0.1:Q2, advertises 127.0.0.3
    PartitionProxy 127.0.0.2:Q1 -> 127.0.0.1:Q1, 127.0.0.3:Q2 -> 127.0.0.1:Q2
    router --Reserve--> D (one of two, gRPC: never partitioned)
    router --Prefill--> P: computes, pushes every layer through D's proxy, holds before its
        COMMIT (tandem/worker/commit_hold.py)
    test: sees the hold, partitions D's proxy, releases P -> the COMMIT and its ACK are held;
        P's push runs out its --transfer-timeout-s, its first token having been ready within
        the first half of it: the receiver stopped answering (tandem/worker/prefill/service.py
        ``_out_of_time``) -> UNAVAILABLE with the ``tandem-fault: receiver`` trailer
    router: the leg is lost, not P: Abort on D, Reserve on the other D, prefill again on P

The partition lands inside the push by construction (the hold), whichever decode worker the
router picked; every wait is on a condition, and the proxies and processes are stopped on
every way out.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests import scrape
from tests.chaos.greedy import generate_ids, prompt_ids
from tests.chaos.partition_proxy import PartitionProxy
from tests.integration.sdk_cluster import (
    MODEL_ID,
    RouterAccess,
    wait_routed,
    wait_until,
    worker_idle,
    worker_stats,
)
from tests.integration.served_model import engine_flags, start_all, tiny_served_model
from tests.unit.engine._reference import hf_greedy

MAX_TOKENS = 12
# The prefill worker's push budget: the tiny model's first token is ready in well under half
# of it, so a COMMIT that gets no ACK within it is the receiver's failure; short, so the test
# waits seconds, not the default 30 s.
TRANSFER_TIMEOUT_S = 8.0
ADVERTISED = ("127.0.0.2", "127.0.0.3")  # loopback addresses the proxies listen on



def _routable(router: RouterAccess, role: str) -> float:
    return scrape.value(router.metrics(), "tandem_workers", worker_role=role, routable="true")


def test_kv_partition_during_the_push_migrates(tiny_dir, smollm2_dir, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # only the prefill worker reads it
    flags = engine_flags(model)
    c = Cluster()
    proxies: list[PartitionProxy] = []
    try:
        d1, d2, prefill = start_all(
            c, *[("tandem.worker.decode", "--port", "0", "--kv-port", "0", "--no-kv-shm",
                  "--kv-advertise-host", host, *flags) for host in ADVERTISED],
            ("tandem.worker.prefill", "--port", "0", "--transfer-timeout-s",
             str(TRANSFER_TIMEOUT_S), *flags))
        decodes = (d1, d2)
        for decode, host in zip(decodes, ADVERTISED, strict=True):
            advertised = str(decode.info["kv"])  # what the READY line and Reserve announce
            kv_host, _, kv_port = advertised.rpartition(":")
            assert kv_host == host
            # The worker listens on 127.0.0.1:Q; its peers are told host:Q, the proxy.
            proxies.append(PartitionProxy(f"127.0.0.1:{kv_port}", listen=(host, int(kv_port))))
        router = RouterAccess(c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
            "--prefill", prefill.grpc, "--decode", f"{d1.grpc},{d2.grpc}",
            "--placement", "remote",  # every prompt on the prefill worker: the push is the point
        ))
        wait_routed([router], "decode")
        wait_routed([router], "prefill")
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.proc.grpc))
        text = "The lighthouse keeper counted the ships"
        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["tokens"] = generate_ids(stub, text, MAX_TOKENS)
            except grpc.RpcError as exc:
                result["error"] = exc

        (hold / "hold").touch()  # the next COMMIT waits
        th = threading.Thread(target=run)
        th.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            # Every layer went through D's proxy; which D the policy chose is found out.
            (reserved,) = [d for d in decodes if worker_stats(d, "decode").num_reserved]
            cut = proxies[decodes.index(reserved)]
            cut.partition()
        finally:
            (hold / "release").touch()
            th.join(timeout=300)
        assert not th.is_alive()
        assert "error" not in result, result.get("error")
        assert result["tokens"] == hf_greedy(model, prompt_ids(model, text), MAX_TOKENS)
        survivor = d2 if reserved is d1 else d1
        samples = router.metrics()
        # The leg moved to the other decode worker at once: no retry on "another" prefill
        # worker, no local prefill, and nobody left the pool (D's gRPC side answers, and P
        # did nothing wrong).
        assert scrape.value(samples, "tandem_migrations_total") == 1
        for kind in ("prefill_retry", "local_prefill_fallback"):
            assert scrape.value(samples, "tandem_handoff_fallbacks_total", kind=kind) == 0
        assert (_routable(router, "decode"), _routable(router, "prefill")) == (2, 1)
        assert worker_stats(survivor, "decode").kv_transfer_bytes > 0  # the KV went there

        cut.heal()
        # What the proxy held reaches D (a COMMIT and ABORT for a transfer it has dropped)
        # and changes nothing: every block is free, on every worker.
        wait_until(lambda: worker_idle(reserved, "decode") and worker_idle(survivor, "decode")
                   and worker_idle(prefill, "prefill"))
        assert (_routable(router, "decode"), _routable(router, "prefill")) == (2, 1)
    finally:
        for proxy in proxies:
            proxy.stop()
        c.stop()
