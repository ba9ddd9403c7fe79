"""Strangers flooding a decode worker's KV port while a member pushes (real processes, the
tiny served model): the member's push still gets a connection slot and the request is served
with transformers' greedy output; once the flood stops every block is free.

    flood: a thread keeps STRANGERS raw TCP connections open to the decode worker's KV port,
        each sending nothing (never a proof), reopening any the worker closes (its handshake
        deadline), for as long as the request runs
    router --Reserve--> decode (TCP KV only: --no-kv-shm)
    router --Prefill--> prefill: pushes through the same KV port

More strangers than the port's slots for unproven connections (ReceiverConfig
``max_pending_handshakes``), refilled every REFILL_S: the pool is full whenever the member
connects. A newcomer takes the longest-waiting stranger's slot (tandem/kv_transfer/receiver.py)
and proves itself long before 16 newer strangers could push it out in turn; strangers never
reach a member slot. The flood runs for the whole request, so the outcome does not depend on
when the strangers' handshake deadlines fall.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import grpc

from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
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

STRANGERS = 24  # more than the 16 pre-authentication slots: the pool is always full
REFILL_S = 1.0  # how often the flood reopens what the worker closed
MAX_TOKENS = 8


class Flood:
    """Keeps ``count`` silent TCP connections open to ``address`` until ``stop``."""

    def __init__(self, address: str, count: int) -> None:
        host, _, port = address.rpartition(":")
        self._target = (host, int(port))
        self._count = count
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self.opened = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            alive = []
            for sock in self._sockets:  # drop the ones the worker closed
                try:
                    closed = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    sock.close()
                else:
                    alive.append(sock)
            self._sockets = alive
            while len(self._sockets) < self._count and not self._stopped.is_set():
                try:
                    self._sockets.append(socket.create_connection(self._target, timeout=5))
                    self.opened += 1
                except OSError:
                    break
            self._stopped.wait(REFILL_S)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)
        for sock in self._sockets:
            sock.close()



def test_members_push_through_a_flood_of_strangers(tiny_dir, smollm2_dir) -> None:
    from transformers import AutoTokenizer

    model: Path = tiny_served_model(tiny_dir, smollm2_dir)
    flags = engine_flags(model)
    c = Cluster()
    flood: Flood | None = None
    try:
        decode, prefill = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", "--no-kv-shm", *flags),
            ("tandem.worker.prefill", "--port", "0", *flags))
        router = RouterAccess(c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
            "--prefill", prefill.grpc, "--decode", decode.grpc,
            "--placement", "remote",  # every prompt is pushed: the KV port is the point
        ))
        wait_routed([router], "decode")
        wait_routed([router], "prefill")
        flood = Flood(str(decode.info["kv"]), STRANGERS)
        wait_until(lambda: flood.opened >= STRANGERS, timeout=60)

        text = "The lighthouse keeper counted the ships"
        prompt = AutoTokenizer.from_pretrained(model, local_files_only=True).encode(text)
        sampling = tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                             ignore_eos=True)
        with grpc.insecure_channel(router.proc.grpc) as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            got = [t for m in stub.Generate(tandem_pb2.GenerateRequest(text=text,
                                                                        sampling=sampling),
                                            timeout=300) for t in m.token_ids]
        assert got == hf_greedy(model, prompt, MAX_TOKENS)
        assert worker_stats(decode, "decode").kv_transfer_bytes > 0  # pushed, not local
        flood.stop()
        flood = None
        wait_until(lambda: worker_idle(decode, "decode") and worker_idle(prefill, "prefill"))
    finally:
        if flood is not None:
            flood.stop()
        c.stop()
