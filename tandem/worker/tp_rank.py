"""Ranks 1..N-1 of a worker's tensor-parallel group: the engine's follower, plus this rank's own
KV transfer endpoint over its own cache shard (its KV heads).

    python -m tandem.worker.tp_rank REPLY_FD AGENT_IN_FD AGENT_OUT_FD   (spawned by RankGroup)

The step loop is the engine's (tandem/engine/parallel/follower.py); beside it an agent thread
serves rank 0's worker over the agent pipes (msgpack frames, tandem/engine/parallel/
step_wire.py), so a push or a reservation never waits behind a forward:

    rank 0 -> agent   start {settings}           -> started {kv_endpoint} | {error}
    decode rank       reserve {id, tid, blocks, lease_s} -> reserved {id, error?}
                      release {tid}
    prefill rank      push {id, tid, routes, parts, commit, endpoints, src, dst, timeout_s,
                            first, forked}        -> pushed {id, error?}
                      abort {tid}

A prefill rank pushes the routes that start at it (tandem/kv_transfer/reshard.py) straight
to the decode ranks that hold their heads, commits the decode ranks it is the committer of
and finishes the other routes; rank 0 commits decode rank 0 once every rank has answered. A
decode rank holds each reservation rank 0 makes, at the same block ids, for its own heads.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from typing import Any, BinaryIO

from tandem.engine.parallel import follower
from tandem.engine.parallel.step_wire import read_frame, write_frame
from tandem.kv_transfer import (
    Endpoint,
    OutgoingTransfer,
    Receiver,
    ReceiverConfig,
    Sender,
    SenderConfig,
    TlsConfig,
)
from tandem.kv_transfer.reshard import GroupKv, Route

log = logging.getLogger("tandem.worker.tp_rank")


class KvAgent:
    """This rank's KV endpoint, driven by rank 0's frames (module docstring)."""

    def __init__(self, kv: Any, rank: int, inp: BinaryIO, out: BinaryIO) -> None:
        self.kv, self.rank = kv, rank
        self._inp, self._out = inp, out
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._sender: Sender | None = None
        self._receiver: Receiver | None = None
        self._pushes: dict[str, list[OutgoingTransfer]] = {}
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                             name="tp-kv-loop")
        self._loop_thread.start()
        threading.Thread(target=self._read, daemon=True, name="tp-kv-pipe").start()

    # -- pipes --------------------------------------------------------------------------------
    def _reply(self, msg: dict[str, Any]) -> None:
        with self._lock:
            try:
                write_frame(self._out, msg)
            except OSError:  # rank 0 is gone: the step loop ends this process
                pass

    def _read(self) -> None:
        while True:
            try:
                msg = read_frame(self._inp)
            except Exception:
                log.exception("bad frame from rank 0's worker")
                return
            if msg is None:
                return
            asyncio.run_coroutine_threadsafe(self._handle(msg), self._loop)

    async def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg["kind"]
        try:
            if kind == "start":
                await self._start(msg)
            elif kind == "reserve":
                await self._reserve(msg)
            elif kind == "release":
                if self._receiver is not None:
                    self._receiver.release(str(msg["tid"]), "released by rank 0")
            elif kind == "push":
                await self._push(msg)
            elif kind == "abort":
                for t in self._pushes.pop(str(msg["tid"]), []):
                    await t.abort("aborted by rank 0")
            else:
                log.error("unexpected agent frame %r", kind)
        except Exception:
            log.exception("agent frame %r failed", kind)

    # -- frames ---------------------------------------------------------------------------------
    async def _start(self, msg: dict[str, Any]) -> None:
        s = msg["settings"]
        group = GroupKv.from_wire(s["group"])
        tls = TlsConfig(**s["tls"]) if s.get("tls") else None
        try:
            if s["role"] == "decode":
                self._receiver = Receiver(self.kv, group.layout, ReceiverConfig(
                    secret=s["secret"], host=s["host"], port=0,
                    advertise_host=s.get("advertise_host"), enable_shm=bool(s["shm"]), tls=tls,
                    codecs=tuple(s["codecs"]),
                    **({"max_stripes": int(s["max_stripes"])} if s.get("max_stripes") else {})),
                    group=group, rank=self.rank)
                endpoint = await self._receiver.start()
                asyncio.get_running_loop().create_task(self._drain_events())
                self._reply({"kind": "started", "kv_endpoint": endpoint.encode()})
            else:
                self._sender = Sender(self.kv, group.layout, SenderConfig(
                    secret=s["secret"], prefer_shm=bool(s["shm"]), tls=tls, codec=s["codec"],
                    stripes=int(s["stripes"])), group=group, rank=self.rank)
                self._reply({"kind": "started", "kv_endpoint": ""})
        except Exception as exc:
            self._reply({"kind": "started", "error": f"{type(exc).__name__}: {exc}"})

    async def _drain_events(self) -> None:
        """Rank 0's receiver reports each transfer's end; this rank's are the same transfers."""
        assert self._receiver is not None
        while True:
            event = await self._receiver.events.get()
            log.debug("rank %d: %r", self.rank, event)

    async def _reserve(self, msg: dict[str, Any]) -> None:
        error = None
        try:
            assert self._receiver is not None, "not a decode rank"
            self._receiver.reserve(str(msg["tid"]), [int(b) for b in msg["blocks"]],
                                   float(msg["lease_s"]), str(msg.get("adapter", "")))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        self._reply({"kind": "reserved", "id": msg["id"], "error": error})

    async def _push(self, msg: dict[str, Any]) -> None:
        tid, error = str(msg["tid"]), None
        try:
            await push_routes(self._sender, msg, self._pushes.setdefault(tid, []))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            for t in self._pushes.get(tid, []):
                await t.abort(f"rank {self.rank}'s push failed: {error}")
        finally:
            self._pushes.pop(tid, None)
        self._reply({"kind": "pushed", "id": msg["id"], "error": error})

    def close(self) -> None:
        """Close the endpoint and stop the loop (bounded)."""
        async def stop() -> None:
            if self._sender is not None:
                await self._sender.close()
            if self._receiver is not None:
                await self._receiver.close()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        except Exception:
            log.exception("closing rank %d's KV endpoint failed", self.rank)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)


async def push_routes(sender: Sender | None, msg: dict[str, Any],
                      opened: list[OutgoingTransfer]) -> None:
    """Push every route of ``msg`` (a push frame) from this rank's cache, all at once: open
    (under the request's LoRA adapter identity, as rank 0's BEGIN), every layer, then commit
    the decode ranks this rank commits and finish the others."""
    if sender is None:
        raise RuntimeError("not a prefill rank")
    deadline = time.monotonic() + float(msg["timeout_s"])
    first_token, first_lp = msg["first"]
    forked = [(int(t), float(lp)) for t, lp in msg["forked"]]
    src, dst = [int(b) for b in msg["src"]], [int(b) for b in msg["dst"]]
    commits = {int(d) for d in msg["commit"]}

    async def one(route: Route) -> None:
        t = await sender.open(str(msg["tid"]), Endpoint.decode(msg["endpoints"][route.dst]),
                              src, dst, deadline, str(msg.get("adapter", "")), route=route,
                              parts=int(msg["parts"][route.dst]))
        opened.append(t)
        t.push(0, sender.layout.num_layers)
        if route.dst in commits:
            await t.commit(int(first_token), float(first_lp), forked=forked)
        else:
            await t.finish_part()

    routes = [Route(*map(int, r)) for r in msg["routes"]]
    await asyncio.gather(*(one(r) for r in routes))


def _make_agent(kv: Any, rank: int, world: int, inp: BinaryIO, out: BinaryIO) -> KvAgent:
    return KvAgent(kv, rank, inp, out)


if __name__ == "__main__":
    sys.exit(follower.main(_make_agent))
