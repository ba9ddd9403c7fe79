"""A router SIGKILLed with requests in flight (real processes, the tiny served model): every
worker ends idle with no KV block held, and nothing is decoded for a reader that is gone.

    two streams decoding on D   their reader (the router's Decode call) is gone when the
                                router's connection closes: D aborts them at once
    one prompt held on P before its COMMIT (tandem/worker/commit_hold.py)
                                the router's Prefill call is gone: P aborts its push, D drops
                                the reservation
    (a stream committed but never attached, the router dying between the prefill reply and
    its Decode call, is aborted at D's attach lease: tests/unit/worker/decode/test_service.py)

The decode worker is stopped (SIGSTOP) while the router dies, so the streams cannot run to
their end meanwhile: how many tokens it sampled then tells an abort from a run to max_tokens.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests import scrape
from tests.integration.sdk_cluster import LocalCluster, assert_idle, wait_until, worker_stats
from tests.integration.served_model import start_workers, tiny_served_model

pytestmark = pytest.mark.slow

MAX_TOKENS = 900  # the tiny model's context is 1,024: prompt + MAX_TOKENS fits
STREAMS = 2
# A generous bound on "ends idle": the decode worker's attach lease (10 s) is the longest
# anything may wait for a reader that never comes.
IDLE_WITHIN_S = 60.0


def _generated(metrics: str) -> float:
    """Tokens the decode worker's engine has sampled so far."""
    return scrape.value(scrape.parse(scrape.fetch(metrics)), "tandem_generation_tokens_total")


def test_router_killed_mid_stream_leaves_workers_idle(tiny_dir, smollm2_dir, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # only the prefill worker reads it
    c = Cluster()
    try:
        decode, prefill = start_workers(c, model, decode_extra=("--metrics-port", "0"))
        local = LocalCluster(c, model, prefill, decode)
        router = local.start_router()
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        sampling = tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                             ignore_eos=True)

        def request(text: str) -> tandem_pb2.GenerateRequest:
            return tandem_pb2.GenerateRequest(text=text, sampling=sampling)

        (hold / "hold").touch()  # one request stops on P just before its COMMIT
        held = stub.Generate(request("A held story:"), timeout=600)
        reader = threading.Thread(target=_drain, args=(held,))
        reader.start()
        wait_until(lambda: (hold / "held").exists(), timeout=120)

        streams = [stub.Generate(request(f"Story number {i}:"), timeout=600)
                   for i in range(STREAMS)]
        for stream in streams:  # each is decoding on D: its first tokens came through
            for _ in range(3):
                next(stream)
        decode.popen.send_signal(signal.SIGSTOP)  # nothing more is sampled meanwhile
        try:
            assert worker_stats(prefill, "prefill").num_reserved == 1  # the held push
            router.kill()
        finally:
            decode.popen.send_signal(signal.SIGCONT)
        reader.join(timeout=60)
        assert not reader.is_alive()

        assert_idle(local, timeout=IDLE_WITHIN_S)
        # Aborted where they were, not decoded to max_tokens for nobody.
        assert _generated(decode.info["metrics"]) < STREAMS * MAX_TOKENS / 2
    finally:
        c.stop()


def _drain(call: grpc.Call) -> None:
    """Read a stream until it ends or fails (its router is gone)."""
    try:
        for _ in call:  # type: ignore[attr-defined]
            pass
    except grpc.RpcError:
        pass
