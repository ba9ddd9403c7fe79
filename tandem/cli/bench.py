"""``tandem bench``: the serving benchmark (tandem/loadgen) against any router, with a
progress bar, a summary table and, with ``--plot``, a PNG of latency distributions.

    tandem bench --target 127.0.0.1:50051 --rate 2 --num-requests 50 --mix mixed \\
        --plot latency.png --json run.json

The load is open-loop (Poisson arrivals at ``--rate``), so the numbers show how the service
behaves at that offered load, not how fast one client can push it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from tandem.cli.common import add_client_args, client_config_from_args
from tandem.cli.main import has_package, missing_package
from tandem.common.arg_parser import ArgParser
from tandem.loadgen.report import plot, table
from tandem.loadgen.run import add_load_args, parse_vocab, run_benchmark
from tandem.loadgen.stats import RequestResult
from tandem.sdk._channel import channel_credentials


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="tandem bench", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="tandem", help="column title in the table")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of latency CDFs here")
    p.add_argument("--json", type=Path, default=None, help="write summary + records here")
    p.add_argument("--model", default="", help="model id (default: the served one)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_client_args(p, timeout=False)  # --timeout: add_load_args' per-request deadline
    add_load_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the load, print the table; 1 when any request failed."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = client_config_from_args(args)
        parse_vocab(args.vocab)  # a malformed --vocab is a usage error, not a traceback
    except (ValueError, OSError) as err:
        parser.error(str(err))
    if args.num_requests < 1 or args.rate <= 0:
        parser.error("--num-requests must be >= 1 and --rate > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be >= 1")
    if args.plot is not None and not has_package("matplotlib"):
        parser.error(f"--plot {missing_package('matplotlib')}")
    failures: list[str] = []
    with tqdm(total=args.num_requests, desc="requests", unit="req", disable=args.no_progress,
              dynamic_ncols=True) as bar:

        def progress(result: RequestResult) -> None:
            if not result.ok:
                failures.append(f"{result.kind}: {result.error}")
                bar.set_postfix(failed=len(failures))
            bar.update(1)

        summary, results = run_benchmark(
            config.target, args, model=args.model, api_key=config.api_key,
            credentials=channel_credentials(config), progress=progress,
        )
    print(table({args.label: summary}))
    for line in failures[:10]:
        print(f"failed: {line}")
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"summary": summary, "records": [asdict(r) for r in results]}, indent=1))
    if args.plot is not None:
        plot({args.label: results}, args.plot, title=f"{args.mix} at {args.rate:g} req/s")
        print(f"plot: {args.plot}")
    return 0 if summary["failed"] == 0 else 1
