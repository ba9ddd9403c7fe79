"""Where each second of TTFT goes: the router's and the workers' spans, request by request.

    python -m bench.serving.ttft_breakdown [--config default] [--shape steady] [--threads 2]
    python -m bench.serving.ttft_breakdown --trace FILE       (a trace file a run already wrote)

Starts ``tandem local`` (a configuration of bench/serving/load_shapes.py) with ``--trace-file``, runs
one of its load shapes, then lays each request's spans end to end (times from the router's
arrival to the first token leaving the router, which is when the prefill worker's reply
arrives: TTFT does not wait for the decode worker)::

    client send -> router arrival          client        (client TTFT - router TTFT)
    arrival -> admitted                    admission     (waiting for an admission slot)
    tokenize                               tokenize
    the rest before the handoff            router
    placement                              placement     (the cost model's decision)
    DecodeService/Reserve                  reserve
    PrefillService/Prefill, client side:
        the call reaching the worker       rpc
        prefill.engine                     queued        (behind other prompts: the span
                                                          less its own step, from the step log)
                                           prefill       (the prompt's own step)
        kv.commit                          commit        (the push's last layers, COMMIT)
        the rest of the worker's span      worker
    DecodeService/PrefillLocal             local         (placement chose the decode worker)

Prints each phase's median and p90 over the requests and its share of the mean TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

PHASES = ("client", "admission", "tokenize", "router", "placement", "reserve", "rpc",
          "queued", "prefill", "commit", "worker", "local")


def _ms(a_ns: int, b_ns: int) -> float:
    return (b_ns - a_ns) / 1e6


def breakdown(spans: list[dict], steps: list[dict] | None = None) -> list[dict[str, float]]:
    """One dict per request (phase -> ms, and ``ttft`` at the router), from a trace file's
    spans; requests without a first token (failed, or not traced) are left out. With the
    workers' step logs, ``prefill`` keeps the prompt's own step (the last prompt step that ended
    inside its ``prefill.engine`` span) and ``queued`` gets the rest of the span."""
    prompt_steps = sorted(((s["start"] + s["s"]) * 1e9, s["s"] * 1e3)
                          for s in steps or () if s["tokens"] > 0 and s["rows"] == 0)
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for s in spans:
        by_trace[s["trace_id"]].append(s)
    out = []
    for group in by_trace.values():
        named: dict[tuple[str, str, str], dict] = {}
        for s in group:  # the first of each (service, name, kind): the request's first leg
            named.setdefault((s["service"], s["name"], s["kind"]), s)

        def get(name: str, kind: str = "INTERNAL", named: dict = named) -> dict | None:
            return next((s for (_, n, k), s in named.items() if n == name and k == kind), None)

        request = get("request", "SERVER")
        prefill = get("PrefillService/Prefill", "CLIENT")
        local = get("DecodeService/PrefillLocal", "CLIENT")
        first = prefill or local
        if request is None or first is None or first["status"] == "ERROR":
            continue
        row = dict.fromkeys(PHASES, 0.0)
        row["ttft"] = _ms(request["start_ns"], first["end_ns"])
        before = _ms(request["start_ns"], (get("placement") or first)["start_ns"])
        for name in ("admission", "tokenize", "placement"):
            span = get(name)
            if span is not None:
                row[name] = _ms(span["start_ns"], span["end_ns"])
        row["router"] = before - row["admission"] - row["tokenize"]
        reserve = get("DecodeService/Reserve", "CLIENT")
        if reserve is not None:
            row["reserve"] = _ms(reserve["start_ns"], reserve["end_ns"])
        if local is not None and prefill is None:
            row["local"] = _ms(local["start_ns"], local["end_ns"])
        else:
            server = get("PrefillService/Prefill", "SERVER")
            call = _ms(prefill["start_ns"], prefill["end_ns"])
            engine, commit = get("prefill.engine"), get("kv.commit")
            in_engine = _ms(engine["start_ns"], engine["end_ns"]) if engine else 0.0
            row["prefill"] = in_engine
            own = [ms for end, ms in prompt_steps
                   if engine and engine["start_ns"] < end <= engine["end_ns"] + 2e6]
            if own:  # the span's last prompt step computed this prompt's last chunk
                row["queued"], row["prefill"] = max(in_engine - own[-1], 0.0), own[-1]
            row["commit"] = _ms(commit["start_ns"], commit["end_ns"]) if commit else 0.0
            inside = _ms(server["start_ns"], server["end_ns"]) if server else call
            row["worker"] = max(inside - in_engine - row["commit"], 0.0)
            row["rpc"] = max(call - inside, 0.0)
        out.append(row)
    return out


def report(rows: list[dict[str, float]], client_ttft_s: list[float] | None = None) -> str:
    """Median, p90 and share of the mean router TTFT per phase."""
    if not rows:
        return "no request with a first token in the trace"
    if client_ttft_s:
        gap = statistics.median(client_ttft_s) * 1e3 - statistics.median(r["ttft"] for r in rows)
        for r in rows:
            r["client"] = max(gap, 0.0)
    mean_ttft = statistics.fmean(r["ttft"] + r["client"] for r in rows)
    lines = [f"{len(rows)} requests; router TTFT p50 {statistics.median(r['ttft'] for r in rows):.0f}"
             f" ms, mean {statistics.fmean(r['ttft'] for r in rows):.0f} ms",
             f"{'phase':10s} {'p50 ms':>9s} {'p90 ms':>9s} {'share':>7s}"]
    for phase in PHASES:
        values = sorted(r[phase] for r in rows)
        if not any(values):
            continue
        p90 = values[min(int(0.9 * len(values)), len(values) - 1)]
        share = statistics.fmean(values) / mean_ttft if mean_ttft else 0.0
        lines.append(f"{phase:10s} {statistics.median(values):9.1f} {p90:9.1f} {share:7.1%}")
    return "\n".join(lines)


def read_spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=None, help="read this trace file instead")
    p.add_argument("--step-log", type=Path, default=None, help="and this step log")
    p.add_argument("--config", default="default", help="a bench/serving/load_shapes.py configuration")
    p.add_argument("--shape", default="steady", help="a bench/serving/load_shapes.py shape")
    p.add_argument("--flag", action="append", default=[],
                   help="one more tandem local flag (repeat), e.g. --flag=--worker-arg=--x=1")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.trace is not None:
        steps = read_spans(args.step_log) if args.step_log else None
        print(report(breakdown(read_spans(args.trace), steps)))
        return 0
    from bench.serving.load_shapes import TANDEM, shapes, tandem_local
    from tandem.loadgen.load import run_openai

    if args.config not in TANDEM:
        p.error(f"--config must be one of {sorted(TANDEM)}")
    (shape,) = shapes([args.shape], 0.8, 40, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        trace, log = Path(tmp) / "spans.jsonl", Path(tmp) / "steps.jsonl"
        flags = (*TANDEM[args.config], *args.flag, f"--trace-file={trace}",
                 f"--worker-arg=--step-log={log}")
        with tandem_local(flags, args.threads) as base:
            results, _ = asyncio.run(run_openai(base, shape.specs, timeout_s=900.0,
                                                max_concurrency=shape.max_concurrency))
        client = [r.ttft for r in results if r.ok]
        print(f"{args.config} under {args.shape}: client TTFT p50 "
              f"{statistics.median(client):.2f} s")
        print(report(breakdown(read_spans(trace), read_spans(log)), client))
    return 0


if __name__ == "__main__":
    sys.exit(main())
