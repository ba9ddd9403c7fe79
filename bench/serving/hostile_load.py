"""Hostile input against a router while a normal stream runs: who pays for it?

    python -m bench.serving.hostile_load [--model smollm2] [--rounds 3] [--out docs/bench]

Starts a router with one prefill and one decode worker (``tandem.launcher.local_cluster``), then for
each round runs one normal greedy stream twice, side by side in the same run:

    alone           nothing else on the router
    under attack    while attackers send, as fast as the router answers them:
                      huge text prompts (3.5 MiB: under the body limit, over the context),
                      2,000 stop strings of 1,000 characters,
                      bodies over the HTTP size limit (413)

and prints the normal stream's TPOT under attack over TPOT alone (1.0: the attack cost the
normal user nothing), TTFT the same way, and how fast each hostile kind was refused (p50/p99)
with which status. The router must refuse hostile input before it tokenizes it, so that a
normal stream keeps being served (docs/bench/hostile_load.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import psutil

from tandem.launcher.local_cluster import Cluster
from tandem.loadgen.stats import percentile
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc

HUGE_PROMPT = "lorem ipsum dolor sit amet " * (3_500_000 // 27)
MANY_STOPS = ["x" * 999 + str(i % 10) for i in range(2_000)]
T = TypeVar("T")
NORMAL_PROMPT = "Write a short story about a lighthouse keeper and the sea."


@dataclass
class StreamTimes:
    """One normal stream: time to first token and mean gap between later tokens (s)."""

    ttft: float
    tpot: float
    tokens: int
    error: str = ""  # the status that ended the stream early ("" when it finished)


@dataclass
class Refusals:
    """How one hostile kind was answered."""

    codes: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)


async def normal_stream(stub: tandem_pb2_grpc.TandemStub, max_tokens: int) -> StreamTimes:
    """One greedy stream of ``max_tokens`` tokens, timed at the client."""
    sampling = tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    times: list[float] = []
    try:
        async for msg in stub.Generate(tandem_pb2.GenerateRequest(text=NORMAL_PROMPT,
                                                                  sampling=sampling), timeout=300):
            times += [time.perf_counter()] * len(msg.token_ids)
    except grpc.aio.AioRpcError as err:  # the attack cost the normal user their request
        return StreamTimes(time.perf_counter() - t0, math.nan, len(times), err.code().name)
    tpot = (times[-1] - times[0]) / max(len(times) - 1, 1)  # after the first token
    return StreamTimes(times[0] - t0, tpot, len(times))


async def _grpc_attacker(stub: tandem_pb2_grpc.TandemStub, kind: str, stop: asyncio.Event,
                         out: Refusals) -> None:
    while not stop.is_set():
        if kind == "huge_prompt":
            request = tandem_pb2.GenerateRequest(text=HUGE_PROMPT)
        else:
            request = tandem_pb2.GenerateRequest(
                text="hi", sampling=tandem_pb2.SamplingParams(stop=MANY_STOPS, max_tokens=4))
        t0 = time.perf_counter()
        try:
            async for _ in stub.Generate(request, timeout=120):
                pass
            out.codes["OK"] += 1
        except grpc.aio.AioRpcError as err:
            out.codes[err.code().name] += 1
        out.seconds.append(time.perf_counter() - t0)


def _http_attack(url: str, stop: asyncio.Event, out: Refusals) -> None:
    body = json.dumps({"model": "bench", "prompt": "x" * (6 << 20)}).encode()
    while not stop.is_set():
        t0 = time.perf_counter()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                out.codes[str(reply.status)] += 1
        except urllib.error.HTTPError as err:
            out.codes[str(err.code)] += 1
        except OSError as err:  # the server may close a connection that sends too much
            out.codes[type(err).__name__] += 1
        out.seconds.append(time.perf_counter() - t0)


async def attacked_stream(target: str, http: str, max_tokens: int, attackers: int
                          ) -> tuple[StreamTimes, dict[str, Refusals]]:
    """The normal stream while ``attackers`` of each hostile kind keep sending."""
    stop = asyncio.Event()
    refusals = {k: Refusals() for k in ("huge_prompt", "many_stops", "oversize_body")}
    async with grpc.aio.insecure_channel(target) as ch, \
            grpc.aio.insecure_channel(target) as attack_ch:
        normal = tandem_pb2_grpc.TandemStub(ch)
        hostile = tandem_pb2_grpc.TandemStub(attack_ch)
        tasks = [asyncio.create_task(_grpc_attacker(hostile, kind, stop, refusals[kind]))
                 for kind in ("huge_prompt", "many_stops") for _ in range(attackers)]
        url = f"http://{http}/v1/completions"
        tasks += [asyncio.create_task(asyncio.to_thread(_http_attack, url, stop,
                                                        refusals["oversize_body"]))]
        # The attack is under way before the normal request arrives.
        while not all(r.seconds for r in refusals.values()):
            await asyncio.sleep(0.05)
        try:
            times = await normal_stream(normal, max_tokens)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return times, refusals


async def alone_stream(target: str, max_tokens: int) -> StreamTimes:
    async with grpc.aio.insecure_channel(target) as ch:
        return await normal_stream(tandem_pb2_grpc.TandemStub(ch), max_tokens)


class CpuMeter:
    """Cores each process kept busy over a stretch of wall time (user + system CPU / wall)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.busy: dict[str, list[float]] = {name: [] for name in pids}

    def _now(self) -> dict[str, float]:
        return {n: sum(p.cpu_times()[:2]) for n, p in self._procs.items()}

    def measure(self, run: Callable[[], T]) -> T:
        """Run ``run()``; record each process's busy cores while it ran; return its result."""
        before, t0 = self._now(), time.perf_counter()
        out = run()
        after, wall = self._now(), time.perf_counter() - t0
        for name in self._procs:
            self.busy[name].append((after[name] - before[name]) / wall)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.hostile_load", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--attackers", type=int, default=8, help="concurrent senders per gRPC kind")
    p.add_argument("--out", type=Path, default=None, help="write hostile_load.json here")
    args = p.parse_args(argv)

    from tandem.engine.loader import resolve_model

    model_dir = resolve_model(args.model)  # the router's tokenizer
    engine = ["--model", args.model, "--threads", "1"]  # as named: a GGUF keeps its blocks
    cluster = Cluster()
    try:
        print("[bench] starting workers and router ...", file=sys.stderr, flush=True)
        decode = cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0", *engine)
        prefill = cluster.start("tandem.worker.prefill", "--port", "0", *engine)
        router = cluster.start("tandem.router", "--port", "0", "--http-port", "0", "--tokenizer",
                               str(model_dir), "--model-name", "bench",
                               "--decode", decode.grpc, "--prefill", prefill.grpc)
        target, http = router.grpc, str(router.info["http"])
        asyncio.run(alone_stream(target, 4))  # warm every process
        pids = {"router": router.popen.pid, "prefill": prefill.popen.pid,
                "decode": decode.popen.pid, "bench client": os.getpid()}
        cpu_alone, cpu_attacked = CpuMeter(pids), CpuMeter(pids)
        alone: list[StreamTimes] = []
        attacked: list[StreamTimes] = []
        refusals: dict[str, Refusals] = {}
        for r in range(args.rounds):  # alternate so drift in machine state hits both
            print(f"[bench] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            alone.append(cpu_alone.measure(
                lambda: asyncio.run(alone_stream(target, args.max_tokens))))
            times, round_refusals = cpu_attacked.measure(lambda: asyncio.run(
                attacked_stream(target, http, args.max_tokens, args.attackers)))
            attacked.append(times)
            for kind, got in round_refusals.items():
                agg = refusals.setdefault(kind, Refusals())
                agg.codes.update(got.codes)
                agg.seconds += got.seconds
    finally:
        cluster.stop()

    def med(xs: list[StreamTimes], attr: str) -> float:
        done = [getattr(x, attr) for x in xs if not x.error]
        return statistics.median(done) if done else math.nan

    result = {
        "alone": [asdict(x) for x in alone],
        "attacked": [asdict(x) for x in attacked],
        "tpot_ratio": med(attacked, "tpot") / med(alone, "tpot"),
        "ttft_ratio": med(attacked, "ttft") / med(alone, "ttft"),
        "attacked_failed": [x.error for x in attacked if x.error],
        "refusals": {k: {"codes": dict(v.codes), "n": len(v.seconds),
                         "p50_ms": percentile(v.seconds, 50) * 1000,
                         "p99_ms": percentile(v.seconds, 99) * 1000}
                     for k, v in refusals.items()},
        "busy_cores": {name: {"alone": statistics.median(cpu_alone.busy[name]),
                              "attacked": statistics.median(cpu_attacked.busy[name])}
                       for name in cpu_alone.busy},
        "cpu_count": os.cpu_count(),
        "config": {k: str(v) for k, v in vars(args).items()},
    }
    print(f"normal stream, median of {args.rounds}: TPOT alone {med(alone, 'tpot') * 1000:.1f}"
          f" ms, under attack {med(attacked, 'tpot') * 1000:.1f} ms "
          f"(ratio {result['tpot_ratio']:.2f}); TTFT alone {med(alone, 'ttft') * 1000:.0f} ms, "
          f"under attack {med(attacked, 'ttft') * 1000:.0f} ms (ratio {result['ttft_ratio']:.2f})")
    if result["attacked_failed"]:
        print(f"normal streams that failed under attack: {result['attacked_failed']} "
              f"of {len(attacked)}")
    for kind, v in result["refusals"].items():
        print(f"{kind:>14}: {v['n']:5d} sent, answered {v['codes']} in p50 {v['p50_ms']:.1f} ms,"
              f" p99 {v['p99_ms']:.1f} ms")
    print(f"busy cores (of {os.cpu_count()}), alone -> under attack: " + ", ".join(
        f"{n} {v['alone']:.2f} -> {v['attacked']:.2f}" for n, v in result["busy_cores"].items()))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "hostile_load.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
