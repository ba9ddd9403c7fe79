"""One load run: the flags that describe it, and running it against a Tandem endpoint.

``tandem bench`` (tandem/cli/bench.py) and ``scripts/bench_serve.py`` (disaggregated vs
colocated serving on one machine) share these: the same ``--mix``, ``--rate``,
``--num-requests``, ``--seed``, ``--scale``, ``--vocab``, SLO targets and per-request
deadline, so a run means the same thing from either.

    add_load_args      the shared flags
    parse_vocab        ``--vocab LO,HI`` -> (LO, HI)
    run_benchmark      Poisson arrivals of a mix against a target: summary + per-request records
    progress_printer   one stderr line per finished request (for scripts without a progress bar)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from tandem.loadgen.load import run_load
from tandem.loadgen.stats import RequestResult, summarize
from tandem.loadgen.workload import MIXES, make_requests

if TYPE_CHECKING:
    import grpc


def add_load_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``tandem bench`` and scripts/bench_serve.py."""
    p.add_argument("--mix", default="mixed", choices=sorted(MIXES), help="workload mix")
    p.add_argument("--rate", type=float, default=0.3, help="mean arrivals per second")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every prompt/output length")
    p.add_argument("--vocab", default="1000,30000", help="token id range LO,HI of random prompts")
    p.add_argument("--slo-ttft", type=float, default=4.0, help="TTFT target, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.25, help="TPOT target, seconds")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request deadline, seconds")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight: a request waits for its arrival "
                   "and a free slot (with --rate inf, a closed loop of this many users)")


def parse_vocab(text: str) -> tuple[int, int]:
    """``"LO,HI"`` -> (LO, HI)."""
    lo, _, hi = text.partition(",")
    return int(lo), int(hi)


def run_benchmark(
    target: str,
    args: argparse.Namespace,
    *,
    model: str = "",
    api_key: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    progress: Callable[[RequestResult], None] | None = None,
) -> tuple[dict[str, object], list[RequestResult]]:
    """One load run against ``target`` with the flags of ``add_load_args``; summary + records.

    ``model`` "" asks for the served one; ``credentials`` make the channel TLS (None:
    plaintext). ValueError on flags that describe no load (a rate <= 0, a bad vocab range).
    """
    specs = make_requests(
        MIXES[args.mix], args.rate, args.num_requests, seed=args.seed,
        vocab=parse_vocab(args.vocab), scale=args.scale,
    )
    results, duration = asyncio.run(run_load(
        target, specs, model=model, api_key=api_key, timeout_s=args.timeout, progress=progress,
        credentials=credentials, max_concurrency=args.max_concurrency,
    ))
    summary = summarize(results, duration, slo_ttft_s=args.slo_ttft, slo_tpot_s=args.slo_tpot)
    return summary, results


def progress_printer(label: str, total: int) -> Callable[[RequestResult], None]:
    """A progress callback printing one line per finished request to stderr."""
    done = 0

    def report(r: RequestResult) -> None:
        nonlocal done
        done += 1
        state = "ok" if r.ok else f"FAILED {r.error}"
        kind = r.kind if r.conversation < 0 else f"c{r.conversation}t{r.turn}"
        print(f"  [{label} {done}/{total}] {kind:4s} ttft={r.ttft * 1000:6.0f}ms "
              f"tpot={(r.tpot or 0) * 1000:5.0f}ms out={r.output_tokens} {state}",
              file=sys.stderr, flush=True)

    return report
