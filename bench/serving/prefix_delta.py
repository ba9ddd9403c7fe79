"""What the later turns of a conversation push: prefix-delta handoff vs every block.

    python -m bench.serving.prefix_delta [--model smollm2] [--turns 5] [--out docs/bench]

Two runs of one conversation, side by side, each on fresh real processes (router with
``--placement remote`` so every turn crosses the wire; prefill and decode worker on one core
each): ``delta`` is the default decode worker, whose Reserve reuses the conversation's
blocks it already holds; ``full`` runs the decode worker with ``--no-prefix-caching``, so
every turn pushes the whole prompt's KV (the handoff before prefix-delta transfer). Turn k's
prompt is turn k-1's prompt, its reply and a new user turn (token ids; a shared system
prompt opens it). Per turn: prompt tokens, KV bytes the prefill worker pushed (its
``kv_transfer_bytes``, read between turns), their ratio, and TTFT.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import grpc

from tandem.engine.loader import resolve_model
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc


def _flags(model: Path, extra: list[str]) -> list[str]:
    return ["--model", str(model), "--dtype", "float32", "--threads", "1", *extra]


def _start(cluster: Cluster, model: Path, decode_extra: list[str]) -> dict[str, Proc]:
    pin = len(os.sched_getaffinity(0)) >= 2
    procs = {
        "decode": cluster.start("tandem.worker.decode", "--port", "0", "--kv-port", "0",
                                *_flags(model, decode_extra),
                                wrap=("taskset", "-c", "1") if pin else ()),
        "prefill": cluster.start("tandem.worker.prefill", "--port", "0", *_flags(model, []),
                                 wrap=("taskset", "-c", "0") if pin else ()),
    }
    procs["router"] = cluster.start(
        "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", "bench",
        "--decode", procs["decode"].grpc, "--prefill", procs["prefill"].grpc,
        "--placement", "remote")
    return procs


def _pushed(prefill: Proc) -> int:
    with prefill.channel() as channel:
        stub = worker_pb2_grpc.PrefillServiceStub(channel)
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30).kv_transfer_bytes


def _generate(router: Proc, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    request = tandem_pb2.GenerateRequest(
        token_ids=tandem_pb2.TokenIds(ids=prompt),
        sampling=tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                           ignore_eos=True))
    with grpc.insecure_channel(router.grpc) as channel:
        t0 = time.perf_counter()
        ttft, out = 0.0, []
        for msg in tandem_pb2_grpc.TandemStub(channel).Generate(request, timeout=600):
            if not out and msg.token_ids:
                ttft = time.perf_counter() - t0
            out.extend(msg.token_ids)
    return out, ttft


def conversation(procs: dict[str, Proc], turns: int, seed: int) -> list[dict[str, float]]:
    """One conversation's turns through the router; what each pushed and its TTFT."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 30000) for _ in range(224 + 32)]  # system + first user
    rows = []
    for turn in range(1, turns + 1):
        before = _pushed(procs["prefill"])
        reply, ttft = _generate(procs["router"], prompt, 48)
        rows.append({"turn": turn, "prompt_tokens": len(prompt),
                     "pushed_bytes": _pushed(procs["prefill"]) - before, "ttft_s": ttft})
        print(f"[bench] turn {turn}: {rows[-1]}", file=sys.stderr, flush=True)
        prompt = prompt + reply + [rng.randrange(1000, 30000) for _ in range(32)]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run both setups, print the per-turn table, write JSON when asked."""
    p = argparse.ArgumentParser(prog="python -m bench.serving.prefix_delta", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write prefix_delta.json here")
    args = p.parse_args(argv)
    model = resolve_model(args.model)
    runs: dict[str, list[dict[str, float]]] = {}
    for name, extra in (("delta", []), ("full", ["--no-prefix-caching"])):
        cluster = Cluster()
        try:
            print(f"[bench] starting {name} ...", file=sys.stderr, flush=True)
            procs = _start(cluster, model, extra)
            _generate(procs["router"], [5000 + i for i in range(40)], 2)  # warm-up
            runs[name] = conversation(procs, args.turns, args.seed)
        finally:
            cluster.stop()
    lines = ["| turn | prompt tokens | pushed, full (MiB) | pushed, delta (MiB) | delta/full "
             "| TTFT full (s) | TTFT delta (s) |", "|---|---|---|---|---|---|---|"]
    for full, delta in zip(runs["full"], runs["delta"], strict=True):
        ratio = delta["pushed_bytes"] / max(full["pushed_bytes"], 1)
        lines.append(f"| {full['turn']} | {full['prompt_tokens']} | "
                     f"{full['pushed_bytes'] / 2**20:.1f} | {delta['pushed_bytes'] / 2**20:.1f} "
                     f"| {ratio:.3f} | {full['ttft_s']:.2f} | {delta['ttft_s']:.2f} |")
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prefix_delta.json").write_text(json.dumps(
            {"config": {"model": args.model, "turns": args.turns, "seed": args.seed},
             "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
