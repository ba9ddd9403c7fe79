"""Live KV migration on real processes: a move's client-visible gap (seconds, and decode steps
of the stream's source), with and without its pre-copy, and the scale-down of a decode worker
holding N streams three ways.

    python -m bench.serving.live_migration [--model smollm2] [--streams 16] [--tokens 256]
        [--singles 3] [--out docs/bench]

Each variant runs on fresh processes: a prefill worker, two decode workers, a router
(``--placement remote``), every worker on one thread. N greedy streams of ``--tokens`` tokens
start; once each has 8 tokens, RouterAdmin.MoveStreams gathers them all on one decode
worker (the other's streams move to it), which is then taken away:

  migrate    RouterAdmin.DrainWorker(migrate): its streams move live to the other worker;
             the time from the call to the worker's exit. Each move pre-copies the stream's
             full blocks while it decodes on, then stops it and pushes only the tail (the
             router's default, tandem/router/handoff/leg_precopy.py)
  stopcopy   the same without the pre-copy (``--live-move-precopy-blocks 0``): each stream
             stops while its whole KV is pushed
  drain      DrainWorker without migrate: it takes no new work and exits once its streams end
  reprefill  the worker is SIGKILLed: the router re-prefills each stream's prompt + tokens
             sent on the other one; the time until every stream has a token again

Every stream must complete with ``--tokens`` tokens (a failed one is counted and reported).
The gap figures are the router's ``tandem_live_migration_gap_seconds`` and ``_steps``
(tandem/router/handoff/move_gap.py) over the migrate (and stopcopy) variant's moves: first
``--singles`` lone streams moved one at a time (batch 1), then the N streams' two rounds of
moves; with them the KV bytes pushed while the streams decoded on (pre-copy) and while they
were stopped (``tandem_live_migration_precopy_bytes_total``, ``_bytes_total``).
The machine's other load shifts every figure here: run it on an idle machine, and say so
when it was not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from tandem.engine.loader import resolve_model
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc

READY_TOKENS = 8  # tokens each stream has before the moves start


@dataclass
class Stream:
    """One greedy stream in a thread: when each token came, and how it ended."""

    router: str
    prompt: list[int]
    tokens: int
    arrivals: list[float] = field(default_factory=list)
    error: str = ""
    thread: threading.Thread | None = None

    def start(self) -> Stream:
        def go() -> None:
            request = tandem_pb2.GenerateRequest(
                token_ids=tandem_pb2.TokenIds(ids=self.prompt),
                sampling=tandem_pb2.SamplingParams(max_tokens=self.tokens, temperature=0.0,
                                                   ignore_eos=True))
            try:
                with grpc.insecure_channel(self.router) as channel:
                    for msg in tandem_pb2_grpc.TandemStub(channel).Generate(request,
                                                                            timeout=900):
                        now = time.monotonic()
                        self.arrivals.extend([now] * len(msg.token_ids))
            except grpc.RpcError as exc:
                self.error = f"{exc.code().name}: {exc.details()}"

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()
        return self

    def join(self) -> bool:
        """Whether it completed with every token."""
        assert self.thread is not None
        self.thread.join(timeout=900)
        return not self.error and len(self.arrivals) == self.tokens


def _wait(cond: object, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


MOVING = ("migrate", "stopcopy")  # the variants that move streams live


def _start(cluster: Cluster, model: Path, precopy: bool = True) -> tuple[Proc, Proc, Proc]:
    flags = ["--model", str(model), "--dtype", "float32", "--threads", "1"]
    d1 = cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags)
    d2 = cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags)
    prefill = cluster.start("tandem.worker.prefill", "--port", "0", *flags)
    router = cluster.start(
        "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", "bench",
        "--prefill", prefill.grpc, "--decode", f"{d1.grpc},{d2.grpc}", "--placement",
        "remote", "--live-move-precopy-blocks", "1" if precopy else "0")
    return d1, d2, router


def _admin(router: Proc) -> worker_pb2_grpc.RouterAdminStub:
    return worker_pb2_grpc.RouterAdminStub(router.channel())


def _prompt(i: int) -> list[int]:
    return [1000 + (i * 7919 + j * 104729) % 20000 for j in range(48)]


def _streams(router: Proc, n: int, tokens: int, first: int = 0) -> list[Stream]:
    streams = [Stream(router.grpc, _prompt(first + i), tokens).start() for i in range(n)]
    _wait(lambda: all(len(s.arrivals) >= READY_TOKENS or s.error for s in streams))
    return streams


def _gather(router: Proc, away: Proc) -> None:
    reply = _admin(router).MoveStreams(worker_pb2.MoveStreamsRequest(worker=away.grpc),
                                       timeout=300)
    if reply.stayed:
        raise RuntimeError(f"streams stayed on {away.grpc}: {list(reply.reasons)}")


def _gaps(router: Proc) -> dict[str, float]:
    """The router's gap histograms so far: moves, mean seconds, mean steps, share <= 3."""
    with urllib.request.urlopen(f"http://{router.info['http']}/metrics", timeout=30) as r:
        text = r.read().decode()
    got: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("tandem_live_migration_") and \
                    sample.labels.get("le") in (None, "3.0"):
                got[sample.name + sample.labels.get("le", "")] = sample.value
    moves = got.get("tandem_live_migration_gap_seconds_count", 0.0)
    stepped = max(got.get("tandem_live_migration_gap_steps_count", 0.0), 1.0)
    return {"moves": moves,
            "seconds_mean": got.get("tandem_live_migration_gap_seconds_sum", 0.0) / max(moves, 1),
            "steps_mean": got.get("tandem_live_migration_gap_steps_sum", 0.0) / stepped,
            "within_3_steps": got.get("tandem_live_migration_gap_steps_bucket3.0", 0.0) / stepped,
            "precopy_bytes": got.get("tandem_live_migration_precopy_bytes_total", 0.0),
            "stopped_bytes": got.get("tandem_live_migration_bytes_total", 0.0)}


def variant(name: str, model: Path, n: int, tokens: int, singles: int) -> dict[str, float]:
    """One scale-down (see the module docstring), on fresh processes."""
    cluster = Cluster()
    try:
        d1, d2, router = _start(cluster, model, precopy=name != "stopcopy")
        row: dict[str, float] = {}
        if name in MOVING:
            for i in range(singles):  # lone streams: the gap at batch 1
                (s,) = _streams(router, 1, tokens, first=1000 + i)
                holder = d1 if _running(d1) else d2
                _gather(router, holder)
                s.join()
            row.update({f"single_{k}": v for k, v in _gaps(router).items()})
        streams = _streams(router, n, tokens)
        _gather(router, d2)  # every stream on d1 now
        t0 = time.monotonic()
        if name == "reprefill":
            d1.kill()
            _wait(lambda: all(s.error or (s.arrivals and s.arrivals[-1] > t0)
                              or len(s.arrivals) == tokens for s in streams))
        else:
            reply = _admin(router).DrainWorker(worker_pb2.DrainWorkerRequest(
                worker=d1.grpc, migrate=name in MOVING), timeout=900)
            row["moved"], row["stayed"] = reply.moved, reply.stayed
            row["moves_s"] = reply.seconds  # the call to its last move
            d1.popen.wait(timeout=900)
        row["scale_down_s"] = time.monotonic() - t0
        row["failed"] = sum(not s.join() for s in streams)
        if name in MOVING:
            row.update({f"all_{k}": v for k, v in _gaps(router).items()})
        print(f"[bench] {name}: {row}", file=sys.stderr, flush=True)
        return row
    finally:
        cluster.stop()


def _running(worker: Proc) -> int:
    with worker.channel() as channel:
        return worker_pb2_grpc.DecodeServiceStub(channel).Stats(
            worker_pb2.StatsRequest(), timeout=30).num_running


def main(argv: list[str] | None = None) -> int:
    """Run the three variants, print the table, write JSON when asked."""
    p = argparse.ArgumentParser(prog="python -m bench.serving.live_migration",
                                description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--singles", type=int, default=3)
    p.add_argument("--variants", default="migrate,stopcopy,drain,reprefill")
    p.add_argument("--out", type=Path, default=None, help="write live_migration.json here")
    args = p.parse_args(argv)
    model = resolve_model(args.model)
    rows = {v: variant(v, model, args.streams, args.tokens, args.singles)
            for v in args.variants.split(",")}
    print(f"| variant | scale-down of a decode worker with {args.streams} streams (s) | "
          "failed requests |\n|---|---|---|")
    for v, row in rows.items():
        print(f"| {v} | {row['scale_down_s']:.2f} | {row['failed']:.0f} |")
    for v in (v for v in MOVING if v in rows):
        m = rows[v]
        how = "with pre-copy" if v == "migrate" else "without pre-copy (stop-and-copy)"
        print(f"\ngap of a live move {how}, lone streams: "
              f"{m['single_seconds_mean'] * 1e3:.1f} ms = {m['single_steps_mean']:.2f} steps "
              f"(mean over {m['single_moves']:.0f}); every move: "
              f"{m['all_seconds_mean'] * 1e3:.1f} ms = {m['all_steps_mean']:.2f} steps (mean "
              f"over {m['all_moves']:.0f}, {m['all_within_3_steps']:.0%} within 3); KV pushed "
              f"while decoding {m['all_precopy_bytes'] / 2**20:.1f} MiB, while stopped "
              f"{m['all_stopped_bytes'] / 2**20:.1f} MiB")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "live_migration.json").write_text(json.dumps(
            {"config": vars(args) | {"out": str(args.out), "cpus": os.cpu_count()},
             "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
