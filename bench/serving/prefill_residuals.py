"""Where a served prefill's time went, against what the router predicted for it.

    python -m bench.serving.prefill_residuals SWEEP_DIR [--setup disagg] [--all-prompts]

SWEEP_DIR is a ``scripts/bench_serve --sweep ... --out SWEEP_DIR`` folder: its
``serve_sweep.json`` (with each request's record) and ``steps-<setup>/`` (the workers' step
logs and the router's placement log). For each point, over the prompts the placement model
placed (reason ``slo`` or ``cheapest``; chat-sized ones unless ``--all-prompts``), medians of:

    residual   measured TTFT from the decision - the model's compute prediction at the
               decision (what tandem/placement/overheads.PrefillOverheads learns)
    wait       decision -> the worker's step with the prompt starts
    step       that step's length, and step / fit: against the worker's reported fit for it
               (base + new tokens x per token; beside decode rows on the decode worker)
    after      the step's end -> the first token at the client (KV push and commit for a
               remote prefill, the replies on the way back)

so a learnt overhead can be split into the handoff's own cost (wait + after) and the fit's
error on the worker (step / fit). Requests are matched to decisions by prompt length, in
order, within each point's window (``host_overlap.window``); a point whose decisions do not
match its requests one to one (a migrated leg decides twice) is left out.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.planner.placement_inputs import CHAT_TOKENS
from bench.serving.logs import read_point_logs, steps_dir
from tandem.placement.log import MODEL_REASONS
from tandem.worker.step_log import StepRecord

SIDES = ("remote", "local")
FIGURES = ("residual_s", "wait_s", "step_s", "step_over_fit", "after_s")
SEARCH_S = 60.0  # how far after its decision a prompt's step is looked for


class _Steps:
    """A worker's step log (tandem/worker/step_log.py records), searchable by start time."""

    def __init__(self, steps: Sequence[StepRecord]) -> None:
        self.steps = sorted(steps, key=lambda s: s.start)
        self.starts = [s.start for s in self.steps]

    def prompt_step(self, after: float, tokens: int, exact: bool) -> StepRecord | None:
        """The first step from ``after`` on that carries ``tokens`` prompt tokens: exactly
        that many (``exact``: a remote prefill's own step), or at least (a local prefill
        beside decode rows, perhaps with another prompt). A prompt split over chunks has no
        such step: None."""
        i = bisect.bisect_left(self.starts, after - 1e-3)
        while i < len(self.steps) and self.steps[i].start < after + SEARCH_S:
            s = self.steps[i]
            if (s.tokens == tokens) if exact else (s.tokens >= tokens):
                return s
            i += 1
        return None


def _fit_s(side: Mapping[str, Any] | None, new: int, rows: int = 0,
           per_row: float | None = None) -> float | None:
    if not side or side.get("base_s") is None or side.get("per_token_s") is None:
        return None
    return side["base_s"] + (per_row or 0.0) * rows + side["per_token_s"] * new


def match_decisions(records: Sequence[Mapping[str, Any]],
                    placements: Sequence[Mapping[str, Any]]
                    ) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Each request with its placement decision: the k-th request of a prompt length (by
    send time) with the k-th decision for that length (two requests sent together may be
    decided in either order). Empty when the lengths do not match one to one."""
    requests = sorted(records, key=lambda r: r["sent_at"])
    if sorted(p["tokens"] for p in placements) != sorted(r["prompt_tokens"] for r in requests):
        return []
    by_length: dict[int, list[Mapping[str, Any]]] = {}
    for p in placements:
        by_length.setdefault(p["tokens"], []).append(p)
    taken: dict[int, int] = {}
    pairs = []
    for r in requests:
        n = r["prompt_tokens"]
        k = taken.get(n, 0)
        taken[n] = k + 1
        pairs.append((by_length[n][k], r))
    return pairs


def point_residuals(records: Sequence[Mapping[str, Any]],
                    placements: Sequence[Mapping[str, Any]], prefill_steps: Sequence[StepRecord],
                    decode_steps: Sequence[StepRecord], max_tokens: int | None = CHAT_TOKENS
                    ) -> dict[str, Any] | None:
    """One point: ``records`` (bench_serve's per-request dicts), the placement records of its
    window, both workers' steps. Per side, ``n`` and the medians of :data:`FIGURES`; None
    when the decisions do not match the requests (:func:`match_decisions`)."""
    prefill, decode = _Steps(prefill_steps), _Steps(decode_steps)
    pairs = match_decisions(records, placements)
    if not pairs:
        return None
    # The client's clock against the router's: the smallest decision - send gap.
    offset = min(p["t"] - r["sent_at"] for p, r in pairs)
    rows: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for p, r in pairs:
        if (p["reason"] not in MODEL_REASONS or not r["ok"]
                or (max_tokens is not None and p["tokens"] > max_tokens)):
            continue
        measured = offset + r["sent_at"] + r["ttft"] - p["t"]
        if p["decision"] == "remote":
            chosen = next((c for c in p["prefill"] if c["endpoint"] == p["endpoint"]), None)
            if chosen is None or chosen["ttft_s"] is None:
                continue
            predicted = chosen["ttft_s"] - chosen["overhead_s"]
            new = max(p["tokens"] - chosen["cached"], 1)
            step = prefill.prompt_step(p["t"], new, exact=True)
            fit = _fit_s(chosen, new)
        else:
            local = p["local"]
            if local is None:
                continue
            predicted = local["ttft_s"] - local.get("overhead_s", 0.0)
            new = max(p["tokens"] - p["decode"]["cached"], 1)
            step = decode.prompt_step(p["t"], new, exact=False)
            fit = None if step is None else _fit_s(p["decode"], step.tokens, step.rows,
                                                    p["decode"]["per_row_s"])
        row = {"residual_s": measured - predicted}
        if step is not None:
            row |= {"wait_s": step.start - p["t"], "step_s": step.seconds,
                    "after_s": offset + r["sent_at"] + r["ttft"] - step.end}
            if fit:
                row["step_over_fit"] = step.seconds / fit
        rows[p["decision"]].append(row)
    out: dict[str, Any] = {}
    for side, got in rows.items():
        entry: dict[str, Any] = {"n": len(got)}
        for name in FIGURES:
            values = [g[name] for g in got if name in g]
            entry[name] = statistics.median(values) if values else None
        out[side] = entry
    return out


def sweep_residuals(folder: Path, setup: str = "disagg", max_tokens: int | None = CHAT_TOKENS
                    ) -> dict[str, dict[str, Any] | None]:
    """:func:`point_residuals` for every point of ``setup`` in a bench_serve ``--out`` folder."""
    sweep = json.loads((folder / "serve_sweep.json").read_text())
    if "records" not in sweep:
        raise ValueError(f"{folder}/serve_sweep.json has no per-request records")
    steps = steps_dir(folder, setup)
    out: dict[str, dict[str, Any] | None] = {}
    for label, summary in sweep["summaries"][setup].items():
        window = (summary.get("host_overlap") or {}).get("window")
        if window is None:
            out[label] = None
            continue
        logs = read_point_logs(steps, *window)
        if logs.prefill is None or logs.decode is None or logs.placements is None:
            raise FileNotFoundError(f"{steps}: a step log or the placement log is missing")
        out[label] = point_residuals(sweep["records"][setup][label], logs.placements,
                                     logs.prefill, logs.decode, max_tokens)
    return out


def residual_table(by_point: Mapping[str, Mapping[str, Any] | None]) -> str:
    """One line per point and side: n, then the figures (seconds in ms)."""
    head = f"{'point':<14} {'side':<7} {'n':>3}  " + "  ".join(
        f"{n.removesuffix('_s'):>13}" for n in FIGURES)
    lines = [head]
    for label, got in by_point.items():
        if got is None:
            lines.append(f"{label:<14} (decisions do not match the requests, or no window)")
            continue
        for side in SIDES:
            entry = got[side]
            cells = []
            for name in FIGURES:
                v = entry[name]
                cells.append("-" if v is None else f"{v:.2f}" if name == "step_over_fit"
                             else f"{v * 1e3:.0f}")
            lines.append(f"{label:<14} {side:<7} {entry['n']:>3}  "
                         + "  ".join(f"{c:>13}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.prefill_residuals", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a scripts/bench_serve --out folder")
    p.add_argument("--setup", default="disagg")
    p.add_argument("--all-prompts", action="store_true",
                   help=f"every prompt, not only chat-sized ones (<= {CHAT_TOKENS} tokens)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    try:
        got = sweep_residuals(args.folder, args.setup, None if args.all_prompts else CHAT_TOKENS)
    except (OSError, ValueError, KeyError) as exc:
        print(f"prefill_residuals: {exc}", file=sys.stderr)
        return 2
    print(residual_table(got))
    if args.json is not None:
        args.json.write_text(json.dumps(got, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
