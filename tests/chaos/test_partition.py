"""A network partition between the router and a decode worker, with real processes.

    client --Generate--> router --gRPC--> PartitionProxy --> decode worker (tiny model,
                                                              --advertise-address <proxy>)

The proxy forwards bytes until told to partition; then it forwards nothing, either way, and
closes nothing: the worker looks alive at the socket level and answers nothing, as behind a
dead switch. A stream cut that way must fail with a clear UNAVAILABLE well within the
keepalive bound (the health monitor cuts the call after two unreachable probes; keepalive
closes the transport within 15 s regardless), the router must give back its admission slot,
and once the partition heals every KV block on the worker must be free again. Every wait is
on a condition; the proxy and the processes are stopped on every way out.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests import scrape
from tests.chaos.partition_proxy import PartitionProxy
from tests.integration.sdk_cluster import MODEL_ID, RouterAccess, wait_routed, wait_until
from tests.integration.sdk_cluster import worker_stats as _stats
from tests.integration.served_model import engine_flags, tiny_served_model

# Generous: detection takes ~2-5 s (two failed probes) and keepalive at most 15 s.
FAIL_WITHIN_S = 30.0
MAX_TOKENS = 900  # far more than the tokens sent before the partition; the model's
# context is 1,024, so prompt + MAX_TOKENS fits


def _running(router: RouterAccess) -> float:
    return scrape.value(router.metrics(), "tandem_num_requests_running")


def _kv_free(decode: Proc) -> bool:
    st = _stats(decode, "decode")
    return (st.num_running == st.num_waiting == st.num_reserved == st.num_leased_blocks == 0
            and st.num_free_blocks == st.num_blocks)


def _request() -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        text="Once upon a time",
        sampling=tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                           ignore_eos=True),
    )


# How the router finds the partition: its health monitor (probing every 2 s, the default:
# two unreachable probes cut the call), or keepalive alone (the monitor probes once at the
# start and then not for an hour; the transport's unanswered PING closes it).
FINDERS = {"probe": [], "keepalive": ["--health-interval", "3600"]}


@pytest.mark.parametrize("finder", list(FINDERS))
def test_partition_mid_stream_fails_fast_and_frees_every_block(
    finder: str, tiny_dir, smollm2_dir
) -> None:
    model: Path = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    proxy: PartitionProxy | None = None
    try:
        # The router dials the worker through the proxy: the worker is told that address is
        # its own too (its cluster tokens are minted for the address the router dials).
        proxy = PartitionProxy()
        decode = c.start("tandem.worker.decode", "--port", "0", "--kv-port", "0",
                         "--advertise-address", proxy.address, *engine_flags(model))
        proxy.forward_to(decode.grpc)
        router = RouterAccess(c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
            "--decode", proxy.address, *FINDERS[finder],
        ))
        wait_routed([router], "decode")
        channel = grpc.insecure_channel(router.proc.grpc)
        try:
            stub = tandem_pb2_grpc.TandemStub(channel)
            # A client deadline far past the bound: what ends the stream must be the router.
            stream = stub.Generate(_request(), timeout=300)
            first = next(stream)
            assert first.token_ids and not first.finished  # mid-stream: the leg is decoding
            proxy.partition()
            cut_at = time.monotonic()
            got = len(first.token_ids)
            error: grpc.RpcError | None = None
            try:
                for message in stream:
                    got += len(message.token_ids)
                    assert not message.finished, "the stream finished across a partition"
            except grpc.RpcError as exc:
                error = exc
            took = time.monotonic() - cut_at
            assert error is not None
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "no healthy decode worker" in (error.details() or ""), error
            assert took < FAIL_WITHIN_S, f"failed after {took:.1f} s"
            assert got < MAX_TOKENS
            # The router gave the slot back; the worker is out of its pool.
            wait_until(lambda: _running(router) == 0, timeout=FAIL_WITHIN_S)
            assert scrape.value(router.metrics(), "tandem_workers", worker_role="decode",
                                routable="true") == 0
            proxy.heal()
            # The worker learns the stream is gone (cancelled, or its connection closed)
            # and frees the request's blocks.
            wait_until(lambda: _kv_free(decode), timeout=60)
            if finder == "probe":  # a passing probe puts it back; it serves again
                wait_routed([router], "decode")
                after = list(stub.Generate(tandem_pb2.GenerateRequest(
                    text="Hello", sampling=tandem_pb2.SamplingParams(max_tokens=4)),
                    timeout=120))
                assert after[-1].finished
                wait_until(lambda: _kv_free(decode), timeout=60)
        finally:
            channel.close()
    finally:
        if proxy is not None:
            proxy.stop()
        c.stop()
