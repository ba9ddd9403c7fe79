"""A network partition between the router and a decode worker, with real processes.

    client --Generate--> router --gRPC--> PartitionProxy --> decode worker (tiny model)

The proxy forwards bytes until told to partition; then it forwards nothing, either way, and
closes nothing: the worker looks alive at the socket level and answers nothing, as behind a
dead switch. A stream cut that way must fail with a clear UNAVAILABLE well within the
keepalive bound (the health monitor cuts the call after two unreachable probes; keepalive
closes the transport within 15 s regardless), the router must give back its admission slot,
and once the partition heals every KV block on the worker must be free again. Every wait is
on a condition; the proxy and the processes are stopped on every way out.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests import scrape
from tests.integration.sdk_cluster import MODEL_ID, RouterAccess, wait_routed, wait_until
from tests.integration.sdk_cluster import worker_stats as _stats
from tests.integration.served_model import engine_flags, tiny_served_model

# Generous: detection takes ~2-5 s (two failed probes) and keepalive at most 15 s.
FAIL_WITHIN_S = 30.0
MAX_TOKENS = 900  # far more than the tokens sent before the partition; the model's
# context is 1,024, so prompt + MAX_TOKENS fits


class PartitionProxy:
    """A TCP proxy on 127.0.0.1 to ``target`` whose forwarding can be stopped and resumed
    without closing any socket (``partition``/``heal``); ``stop`` closes everything."""

    def __init__(self, target: str | None = None) -> None:
        self._target: tuple[str, int] | None = None
        if target is not None:
            self.forward_to(target)
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._spawn(self._accept)

    def forward_to(self, target: str) -> None:
        """Where accepted connections go (set before the first one is accepted: the proxy
        listens first so its address can be given to the worker it fronts)."""
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))

    def partition(self) -> None:
        """Stop forwarding, both ways; bytes already read are held, not sent."""
        self._flowing.clear()

    def heal(self) -> None:
        """Forward again, held bytes first (a connection an end closed meanwhile closes)."""
        self._flowing.set()

    def stop(self) -> None:
        """Close the listener and every connection; wait for the forwarding threads."""
        self._stopped = True
        self._flowing.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
                assert self._target is not None, "forward_to() before the first connection"
                upstream = socket.create_connection(self._target)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self._flowing.wait()  # partitioned: hold it (an EOF too) until healed
            if self._stopped:
                return
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return


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
