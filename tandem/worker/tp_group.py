"""Rank 0's worker's side of its tensor-parallel group's KV agents (tandem/worker/tp_rank.py):
start each follower's KV endpoint, and have them reserve, release, push or abort.

    start(settings)        every follower opens its Sender or Receiver over its own cache
                           shard; a decode group's endpoints go into the group endpoint
                           rank 0 publishes (tandem/kv_transfer/group_endpoint.py)
    reserve(tid, blocks)   each decode rank reserves the same blocks for its own heads;
                           returns once every rank has (a push may BEGIN there next)
    release(tid)           each decode rank ends it (idempotent: sent on every end)
    push(tid, frames)      each prefill rank pushes its routes; returns every rank's error
    abort(tid)             each prefill rank aborts what it has opened for ``tid``

Replies come back on one reader thread per follower and resolve futures on rank 0's event
loop. A follower that dies takes the whole worker down (tandem/engine/parallel/group.py), so
a reply that never comes is bounded by the group's own fate and by the caller's timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from typing import Any, BinaryIO

from tandem.engine.parallel.step_wire import read_frame, write_frame
from tandem.kv_transfer.reshard import GroupKv
from tandem.worker.config import WorkerConfig

log = logging.getLogger(__name__)

FOLLOWER_MODULE = "tandem.worker.tp_rank"


class GroupAgentError(RuntimeError):
    """A follower's KV agent could not do what rank 0 asked (the message says which rank)."""


class GroupAgents:
    """The KV agents of ranks 1..N-1, as rank 0's worker drives them."""

    def __init__(self, pipes: list[tuple[BinaryIO, BinaryIO]]) -> None:
        self._pipes = pipes
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._started: list[asyncio.Future[Any]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        for rank, (_, reader) in enumerate(pipes, start=1):
            threading.Thread(target=self._read, args=(rank, reader), daemon=True,
                             name=f"tp-agent-{rank}").start()

    @property
    def world(self) -> int:
        """Ranks in the group, rank 0 included."""
        return len(self._pipes) + 1

    def _send(self, rank: int, msg: dict[str, Any]) -> None:
        with self._lock:
            write_frame(self._pipes[rank - 1][0], msg)

    def _read(self, rank: int, reader: BinaryIO) -> None:
        while True:
            try:
                msg = read_frame(reader)
            except Exception:
                log.exception("bad frame from rank %d's KV agent", rank)
                return
            if msg is None:
                return
            key = msg.get("id", -rank) if msg["kind"] != "started" else -rank
            with self._lock:
                waiting = self._waiting.pop(key, None)
            if waiting is not None:
                loop, fut = waiting
                loop.call_soon_threadsafe(_resolve, fut, msg)

    def _expect(self, key: int) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            self._waiting[key] = (loop, fut)
        return fut

    async def _gather(self, futs: list[asyncio.Future[Any]], timeout: float) -> list[Any]:
        """Every reply, or TimeoutError (the replies still awaited are forgotten)."""
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futs), timeout))
        finally:
            with self._lock:
                for key, (_, fut) in list(self._waiting.items()):
                    if fut in futs:
                        del self._waiting[key]

    async def start(self, settings: dict[str, Any], timeout: float = 60.0) -> list[str]:
        """Start every follower's endpoint; their KV endpoints, by rank 1..N-1 (empty strings
        for prefill ranks). GroupAgentError when one fails."""
        futs = []
        for rank in range(1, self.world):
            futs.append(self._expect(-rank))
            self._send(rank, {"kind": "start", "settings": settings})
        replies = await self._gather(futs, timeout)
        for rank, msg in enumerate(replies, start=1):
            if msg.get("error"):
                raise GroupAgentError(f"rank {rank}'s KV endpoint: {msg['error']}")
        return [str(m["kv_endpoint"]) for m in replies]

    async def reserve(self, tid: str, blocks: list[int], lease_s: float, adapter: str = "",
                      timeout: float = 30.0) -> None:
        """Every decode rank reserves ``blocks`` for ``tid`` under the request's LoRA
        ``adapter`` identity (each rank's BEGIN must match it, as rank 0's); GroupAgentError
        when one cannot (the others' reservations are released)."""
        futs = []
        for rank in range(1, self.world):
            i = next(self._ids)
            futs.append(self._expect(i))
            self._send(rank, {"kind": "reserve", "id": i, "tid": tid, "blocks": blocks,
                              "lease_s": lease_s, "adapter": adapter})
        replies = await self._gather(futs, timeout)
        errors = [f"rank {r}: {m['error']}" for r, m in enumerate(replies, start=1)
                  if m.get("error")]
        if errors:
            self.release(tid)
            raise GroupAgentError("reserving on the group failed: " + "; ".join(errors))

    def release(self, tid: str) -> None:
        """Every decode rank ends its reservation for ``tid`` (if it still holds one)."""
        for rank in range(1, self.world):
            self._send(rank, {"kind": "release", "tid": tid})

    async def push(self, tid: str, frames: dict[int, dict[str, Any]],
                   timeout: float) -> list[str]:
        """Have each rank in ``frames`` push its routes (its push frame); the errors, if any."""
        futs = []
        for rank, frame in frames.items():
            i = next(self._ids)
            futs.append(self._expect(i))
            self._send(rank, {**frame, "kind": "push", "id": i, "tid": tid})
        replies = await self._gather(futs, timeout)
        return [f"rank {r}: {m['error']}" for r, m in zip(frames, replies, strict=True)
                if m.get("error")]

    def abort(self, tid: str) -> None:
        """Every prefill rank aborts what it has opened for ``tid``."""
        for rank in range(1, self.world):
            self._send(rank, {"kind": "abort", "tid": tid})


def agent_settings(role: str, wc: WorkerConfig, group: GroupKv, host: str = "",
                   advertise_host: str | None = None) -> dict[str, Any]:
    """What every follower's KV endpoint is started with: the worker's own KV settings (the
    secret travels over the follower's private pipe), the group, and for a decode rank the
    host it listens on (an ephemeral port: rank 0's group endpoint publishes it)."""
    tls = wc.kv_tls
    return {"role": role, "secret": wc.kv_secret, "group": group.to_wire(), "host": host,
            "advertise_host": advertise_host, "shm": wc.kv_shm,
            "tls": None if tls is None else {"cert_file": tls.cert_file,
                                             "key_file": tls.key_file,
                                             "ca_file": tls.ca_file,
                                             "server_name": tls.server_name},
            "codec": wc.kv_codec, "codecs": [] if wc.kv_codec == "raw" else [wc.kv_codec],
            "stripes": wc.kv_stripes or 1, "max_stripes": wc.kv_stripes}


def _resolve(fut: asyncio.Future[Any], msg: dict[str, Any]) -> None:
    if not fut.done():
        fut.set_result(msg)
