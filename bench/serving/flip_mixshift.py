"""Role flips on a live local cluster under a token mix that shifts from chat to RAG and back:
SLO attainment with flips against without, in one run.

    python -m bench.serving.flip_mixshift [--model smollm2]
        [--phases chat:1.0:25,rag:0.6:40,chat:1.0:25] [--slo-ttft 4] [--slo-tpot 0.25]
        [--variants static,flips] [--out docs/bench]

Each variant starts ``tandem local --num-prefill 1 --num-decode 2 --flippable`` afresh (workers
of tandem/worker/dual/, one thread each; every prompt prefilled on a prefill worker,
``--placement remote``, so the roles decide where work runs) and sends the same requests:
Poisson arrivals per phase (``KIND:RATE:SECONDS``; tandem/loadgen's CHAT and RAG shapes, random
prompt ids of a fixed seed), open loop, through the router's ``Generate``.

  static  the roles stay as started: one prefill worker, two decode workers
  flips   every ``--scrape-s`` the mix policy (bench/serving/mix_policy.py) reads the router's
          token counters; when prompt tokens reach ``--high`` of the window's tokens it flips
          the spare worker (``decode-1``) to prefill through the router (RouterAdmin.FlipWorker:
          its streams move live to the other decode worker), when they fall to ``--low`` it
          flips it back

``tandem local`` runs no autoscaler (the coupled autoscaler's actuators are Ray's pool and
Kubernetes), so the flips here are the explicit policy's, not the coupled policy's.
Attainment: the share of requests that finished with TTFT and TPOT inside the targets
(failed ones count as misses), overall and per phase (by arrival). The machine's other load
shifts every figure: run it on an idle machine, and say so when it was not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.serving.mix_policy import MixPolicy, MixSettings
from tandem.autoscaler.router_scrape import router_sample
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE
from tandem.launcher.local_cluster import Cluster
from tandem.loadgen.load import run_load
from tandem.loadgen.stats import RequestResult, attainment, percentile
from tandem.loadgen.workload import CHAT, RAG, RequestSpec, scaled
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

KINDS = {"chat": CHAT, "rag": RAG}
SPARE = "decode-1"  # the worker the policy flips (tandem local's name for it)
TO = {"prefill": worker_pb2.ROLE_PREFILL, "decode": worker_pb2.ROLE_DECODE}


@dataclass(frozen=True, slots=True)
class Phase:
    """Requests of one kind arriving at ``rate`` a second for ``seconds``."""

    kind: str
    rate: float
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.kind} {self.rate:g}/s"


def parse_phases(text: str) -> list[Phase]:
    """``KIND:RATE:SECONDS,...`` -> phases (ValueError on an unknown kind or a bad number)."""
    phases = []
    for part in text.split(","):
        kind, rate, seconds = part.split(":")
        if kind not in KINDS or float(rate) <= 0 or float(seconds) <= 0:
            raise ValueError(f"bad phase {part!r}: KIND (chat, rag):RATE>0:SECONDS>0")
        phases.append(Phase(kind, float(rate), float(seconds)))
    return phases


def phase_requests(phases: list[Phase], seed: int = 0, scale: float = 1.0,
                   vocab: tuple[int, int] = (1000, 30000)) -> tuple[list[RequestSpec], list[int]]:
    """Every phase's requests, one after the other (Poisson arrivals inside each phase's
    span), and the phase of each request by index."""
    rng = random.Random(seed)
    specs: list[RequestSpec] = []
    phase_of: list[int] = []
    start = 0.0
    for p, phase in enumerate(phases):
        kind = scaled(KINDS[phase.kind], scale)
        t = start + rng.expovariate(phase.rate)
        while t < start + phase.seconds:
            ids = tuple(rng.randrange(*vocab) for _ in range(rng.randint(*kind.prompt_tokens)))
            specs.append(RequestSpec(len(specs), t, kind.name, ids,
                                     rng.randint(*kind.output_tokens)))
            phase_of.append(p)
            t += rng.expovariate(phase.rate)
        start += phase.seconds
    return specs, phase_of


def _metrics(http: str) -> str:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def _flip_call(cluster: Cluster, router: str, worker: str, role: str
               ) -> worker_pb2.FlipWorkerResponse:
    with cluster.channel(router, ROUTER_AUDIENCE) as channel:
        return worker_pb2_grpc.RouterAdminStub(channel).FlipWorker(
            worker_pb2.FlipWorkerRequest(worker=worker, to=TO[role]), timeout=300)


async def _flip(cluster: Cluster, router: str, worker: str, role: str, policy: MixPolicy,
                t0: float, flips: list[dict[str, Any]]) -> None:
    asked = time.monotonic() - t0
    try:
        reply = await asyncio.to_thread(_flip_call, cluster, router, worker, role)
    except grpc.RpcError as exc:
        policy.refused(time.monotonic() - t0)
        flips.append({"t": asked, "to": role, "error": f"{exc.code().name}: {exc.details()}"})
    else:
        policy.flipped(time.monotonic() - t0, role)
        flips.append({"t": asked, "to": role, "seconds": reply.seconds,
                      "moved": reply.moved.moved, "stayed": reply.moved.stayed})
    print(f"[bench] flip at {asked:.1f} s: {flips[-1]}", file=sys.stderr, flush=True)


async def _drive(cluster: Cluster, local: dict[str, Any], specs: list[RequestSpec],
                 policy: MixPolicy | None, scrape_s: float, timeout_s: float
                 ) -> tuple[list[RequestResult], list[dict[str, Any]]]:
    """The load, and (with a policy) the scrape-decide-flip loop beside it until it ends."""
    router, http, spare = local["grpc"], local["http"], local["workers"][SPARE]
    flips: list[dict[str, Any]] = []
    t0 = time.monotonic()
    load = asyncio.create_task(run_load(router, specs, timeout_s=timeout_s))
    pending: asyncio.Task[None] | None = None
    while policy is not None and not load.done():
        sample = router_sample(await asyncio.to_thread(_metrics, http))
        role = policy.observe(time.monotonic() - t0, sample.prompt_tokens_total,
                              sample.output_tokens_total)
        if role is not None and (pending is None or pending.done()):
            pending = asyncio.create_task(_flip(cluster, router, spare, role, policy, t0, flips))
        await asyncio.wait({load}, timeout=scrape_s)
    results, _ = await load
    if pending is not None:
        await pending
    return results, flips


def variant(name: str, args: argparse.Namespace, specs: list[RequestSpec], phase_of: list[int],
            phases: list[Phase]) -> dict[str, Any]:
    """One variant on a fresh ``tandem local`` (the module docstring): its row."""
    cluster = Cluster()
    assert cluster.credential_flags is not None
    try:
        local = cluster.start(
            "tandem.cli.main", "local", "--model", args.model, "--num-prefill", "1",
            "--num-decode", "2", "--flippable", "--port", "0", "--worker-metrics-port", "-1",
            f"--router-arg=--placement={args.placement}", *cluster.credential_flags)
        settings = MixSettings(window_s=args.window_s, high=args.high, low=args.low,
                               dwell_s=args.dwell_s)
        policy = MixPolicy(settings) if name == "flips" else None
        results, flips = asyncio.run(_drive(cluster, local.info, specs, policy, args.scrape_s,
                                            args.timeout))
    finally:
        cluster.stop()
    slo = (args.slo_ttft, args.slo_tpot)
    row: dict[str, Any] = {"attainment": attainment(results, *slo),
                           "failed": sum(not r.ok for r in results), "flips": flips}
    for p in range(len(phases)):
        mine = [r for r in results if phase_of[r.index] == p]
        done = [r for r in mine if r.ok]
        row[f"phase{p}"] = {"requests": len(mine), "attainment": attainment(mine, *slo),
                            "ttft_p90": percentile([r.ttft for r in done], 90),
                            "tpot_p90": percentile([r.tpot for r in done if r.tpot], 90)}
    print(f"[bench] {name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return row


def table(rows: dict[str, dict[str, Any]], phases: list[Phase]) -> str:
    """The markdown table: attainment overall and per phase, TTFT and TPOT p90 per phase."""
    head = ["variant", "attainment", *(f"{p + 1}: {ph.label}" for p, ph in enumerate(phases)),
            "failed", "flips (to prefill, to decode)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        cells = [name, f"{row['attainment']:.2f}"]
        for p in range(len(phases)):
            ph = row[f"phase{p}"]
            cells.append(f"{ph['attainment']:.2f} (TTFT p90 {ph['ttft_p90']:.2f} s, "
                         f"TPOT p90 {ph['tpot_p90'] * 1e3:.0f} ms; {ph['requests']} req)")
        made = [f for f in row["flips"] if "error" not in f]
        cells += [str(row["failed"]), f"{len(made)} ({sum(f['to'] == 'prefill' for f in made)}, "
                  f"{sum(f['to'] == 'decode' for f in made)})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.flip_mixshift",
                                description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--phases", default="chat:1.0:25,rag:0.6:40,chat:1.0:25",
                   help="KIND:RATE:SECONDS,... (kinds: chat, rag)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=4.0, help="TTFT target, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.25, help="TPOT target, seconds")
    p.add_argument("--placement", default="remote", help="the router's --placement")
    p.add_argument("--variants", default="static,flips")
    p.add_argument("--scrape-s", type=float, default=1.0)
    defaults = MixSettings()
    p.add_argument("--window-s", type=float, default=defaults.window_s)
    p.add_argument("--high", type=float, default=defaults.high)
    p.add_argument("--low", type=float, default=defaults.low)
    p.add_argument("--dwell-s", type=float, default=defaults.dwell_s)
    p.add_argument("--timeout", type=float, default=300.0, help="per-request deadline, s")
    p.add_argument("--out", type=Path, default=None, help="write flip_mixshift.json here")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the variants on the same requests, print the table, write JSON when asked."""
    args = build_parser().parse_args(argv)
    phases = parse_phases(args.phases)
    specs, phase_of = phase_requests(phases, args.seed, args.scale)
    t0 = time.monotonic()
    rows = {v: variant(v, args, specs, phase_of, phases) for v in args.variants.split(",")}
    print(table(rows, phases))
    print(f"\n({len(specs)} requests a variant; {time.monotonic() - t0:.0f} s in all)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "flip_mixshift.json").write_text(json.dumps(
            {"config": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
