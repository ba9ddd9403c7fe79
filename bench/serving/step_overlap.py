"""How much a co-located prefill worker slowed the decode worker's steps, measured under
serving from the two workers' step logs (tandem/worker/step_log.py).

    decode steps ─┐  each decode step's share of its time during prefill steps (overlap)
    prefill steps ┴─> by decode batch size: median step alone (overlap < 5%) and shared
                      (overlap > 95%), their ratio: the host factor as serving saw it

The simulator's host model (tandem/planner/sim/host.py) applies a decode factor while the prefill
worker computes; ``bench.serving.host_contention`` measures it with both engines stepping flat out.
Under serving the decode worker idles between steps and the prefill worker computes in
bursts, and the scheduler shares the cores differently then; this is the same factor read
from a real run. Steps of the same batch size but different contexts are pooled, so the ratio
carries some of the context's spread.

The steps alone also say how far serving itself moves a worker from its profile (the engine
timed alone): ``served_fits`` sets each decode band's and each prefill step's served seconds
beside the profile's step of the same shape and fits ``served = scale x profiled +
overhead`` per worker (bench/planner/validation.py --serving served).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.planner.profile import StepCost
from tandem.planner.sim.host import HostSharing
from tandem.worker.step_log import StepRecord, read_step_log

# Decode batch sizes pooled for the factor: (lowest, highest) rows.
ROW_BANDS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 1 << 30))
ALONE, SHARED = 0.05, 0.95  # overlap below / above which a step counts as alone / shared
PARTLY = 0.5  # a prefill step at least this much under decode steps still gives a factor


def overlaps(steps: Sequence[StepRecord], others: Sequence[StepRecord]) -> list[float]:
    """For each of ``steps``, the share of its duration during any of ``others`` (0..1).
    Both in start order; ``others`` must not overlap one another (one worker's steps)."""
    out, j = [], 0
    for step in steps:
        while j < len(others) and others[j].end <= step.start:
            j += 1
        covered, k = 0.0, j
        while k < len(others) and others[k].start < step.end:
            covered += max(0.0, min(step.end, others[k].end) - max(step.start, others[k].start))
            k += 1
        out.append(min(covered / step.seconds, 1.0) if step.seconds > 0 else 0.0)
    return out


def _name(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"{lo}-{hi}" if hi < ROW_BANDS[-1][1] else f"{lo}+"


def _band(rows: int) -> str:
    """The name of the band ``rows`` falls in ("1", "3-4", "33+")."""
    for lo, hi in ROW_BANDS:
        if lo <= rows <= hi:
            return _name(lo, hi)
    raise ValueError(f"no band for {rows} rows")


def host_overlap(decode: Sequence[StepRecord], prefill: Sequence[StepRecord]) -> dict[str, Any]:
    """The decode worker's steps beside the prefill worker's (none for a colocated worker:
    every step alone), JSON-ready:

    ``decode_shared``   the share of the decode worker's stepping time during prefill steps
    ``prefill_shared``  the share of the prefill worker's stepping time during decode steps
    ``bands``           per decode batch-size band, over the decode worker's pure decode
                        steps (no prompt tokens: a local prefill's steps are left out):
                        steps alone and shared, their median seconds, and ``factor``
                        (shared / alone median; None without both); ``alone_mean`` and
                        ``shared_mean``: each group's mean rows, context tokens and seconds
                        (to set beside a profile's step at that shape: ``mean_factor``)
    ``local_alone_steps``  [rows, prompt tokens, context, seconds] of each of the decode
                        worker's steps with a local prefill's chunk and no prefill step
                        beside it (its served fit: ``decode_local_pairs``)
    ``prefill``         the prefill steps alone and shared (under decode steps), their
                        median seconds per prompt token, and ``factor`` the same way;
                        ``alone_steps`` and ``shared_steps``: [prompt tokens, context,
                        seconds] of each step alone and shared; ``partly_steps``: the
                        same and its share under decode steps, for each between PARTLY
                        and SHARED
    """
    decode = sorted(decode, key=lambda s: s.start)
    prefill = sorted((s for s in prefill if s.tokens > 0), key=lambda s: s.start)
    d_over, p_over = overlaps(decode, prefill), overlaps(prefill, decode)
    groups: dict[str, tuple[list[StepRecord], list[StepRecord]]] = {}
    local_alone = []
    for step, share in zip(decode, d_over, strict=True):
        if step.tokens > 0 and share < ALONE:
            local_alone.append([step.rows, step.tokens, step.context, round(step.seconds, 6)])
        if step.rows == 0 or step.tokens > 0:
            continue
        alone, shared = groups.setdefault(_band(step.rows), ([], []))
        if share < ALONE:
            alone.append(step)
        elif share > SHARED:
            shared.append(step)
    bands = {}
    for name in (_name(lo, hi) for lo, hi in ROW_BANDS):
        if name not in groups:
            continue
        alone, shared = groups[name]
        bands[name] = _compared([s.seconds for s in alone], [s.seconds for s in shared], "s")
        for key, steps in (("alone_mean", alone), ("shared_mean", shared)):
            if steps:
                bands[name][key] = _mean_shape(steps)
    per_token = ([s.seconds / s.tokens for s, f in zip(prefill, p_over, strict=True) if f < ALONE],
                 [s.seconds / s.tokens for s, f in zip(prefill, p_over, strict=True) if f > SHARED])
    # the prefill steps alone, each one's shape (a step's cost is not linear in its tokens)
    alone_steps = [[s.tokens, s.context, round(s.seconds, 6)]
                   for s, f in zip(prefill, p_over, strict=True) if f < ALONE]
    shared_steps = [[s.tokens, s.context, round(s.seconds, 6)]
                    for s, f in zip(prefill, p_over, strict=True) if f > SHARED]
    partly_steps = [[s.tokens, s.context, round(s.seconds, 6), round(f, 4)]
                    for s, f in zip(prefill, p_over, strict=True) if PARTLY <= f <= SHARED]
    return {"decode_shared": _weighted(decode, d_over),
            "prefill_shared": _weighted(prefill, p_over), "bands": bands,
            "local_alone_steps": local_alone,
            "prefill": _compared(*per_token, "token_s") | {"alone_steps": alone_steps,
                                                          "shared_steps": shared_steps,
                                                          "partly_steps": partly_steps}}


def _compared(alone: list[float], shared: list[float], unit: str) -> dict[str, Any]:
    """Counts, medians and their ratio (None without both)."""
    a = statistics.median(alone) if alone else None
    s = statistics.median(shared) if shared else None
    return {"alone": len(alone), f"alone_{unit}": a, "shared": len(shared),
            f"shared_{unit}": s, "factor": s / a if a and s else None}


def _mean_shape(steps: Sequence[StepRecord]) -> dict[str, float]:
    """The steps' mean rows, context tokens and seconds."""
    return {"rows": statistics.fmean(s.rows for s in steps),
            "context": statistics.fmean(s.context for s in steps),
            "s": statistics.fmean(s.seconds for s in steps)}


def _weighted(steps: Sequence[StepRecord], shares: Sequence[float]) -> float:
    total = sum(s.seconds for s in steps)
    return sum(s.seconds * f for s, f in zip(steps, shares, strict=True)) / total if total else 0.0


# A band's batch size in a host-sharing table (tandem/planner/sim/host.py interpolates between).
BAND_ROWS = {"1": 1, "2": 2, "3-4": 3, "5-8": 6, "9-16": 12, "17-32": 23, "33+": 33}
MIN_STEPS = 8  # steps alone and shared a band needs at a point to give a factor


def _usable(compared: dict[str, Any]) -> bool:
    """Whether a band (or the prefill entry) has a factor from enough steps."""
    return bool(compared["factor"]) and min(compared["alone"], compared["shared"]) >= MIN_STEPS


def mean_factor(band: dict[str, Any], step: StepCost) -> float | None:
    """A band's decode steps shared over alone as means, each group's mean seconds over
    ``step`` (the profile's) at its mean rows and context; None without both means (older
    sweeps whose step logs were not kept logged medians only).

    A request's token gaps add its steps up, so the factor that reproduces them is a ratio of
    means: on the 2-core CPU box the shared steps had a tail the median leaves out (about
    once per long prompt a 100-470 ms step beside its prefill, the decode thread's own CPU
    time, not preemption); pooled by batch size, the means said 1.19-1.27x the steps alone
    where the medians said 1.05-1.20x."""
    alone, shared = band.get("alone_mean"), band.get("shared_mean")
    if alone is None or shared is None:
        return None
    return (shared["s"] / _profiled(shared, step)) / (alone["s"] / _profiled(alone, step))


def _profiled(mean: dict[str, float], step: StepCost) -> float:
    """The profile's decode step at a group's mean shape: ``step`` is linear between its
    measured shapes, so there it is the mean of the steps' own."""
    return step.step_s(mean["rows"], 0, mean["context"])


def served_sharing(points: Sequence[dict[str, Any]], step: StepCost | None = None
                   ) -> HostSharing | None:
    """A host model from the ``host_overlap`` of several served points: per band, the median
    of the points' factors (each from at least MIN_STEPS steps alone and shared; with the
    decode profile's ``step``, the ratio of means where the points logged them:
    ``mean_factor``); the prefill factor the median of theirs. None when no band has one.
    Factors under 1 (noise) count as 1."""
    by_band: dict[str, list[float]] = {}
    prefill = []
    for point in points:
        for name, band in point["bands"].items():
            if _usable(band):
                mean = mean_factor(band, step) if step is not None else None
                by_band.setdefault(name, []).append(band["factor"] if mean is None else mean)
        if _usable(point["prefill"]):
            prefill.append(point["prefill"]["factor"])
    if not by_band:
        return None
    table = tuple(sorted((BAND_ROWS[name], max(statistics.median(f), 1.0))
                         for name, f in by_band.items()))
    return HostSharing(table, max(statistics.median(prefill), 1.0) if prefill else 1.0)


def _alone_bands(overlap: dict[str, Any], step: StepCost
                 ) -> Iterator[tuple[str, float, float, int]]:
    """(band, the profile's step at the steps alone's mean rows and context (``_profiled``),
    their mean seconds, their count) of one point's bands with MIN_STEPS or more decode
    steps alone."""
    for name, band in overlap["bands"].items():
        mean = band.get("alone_mean")
        if mean is not None and band["alone"] >= MIN_STEPS:
            yield name, _profiled(mean, step), mean["s"], band["alone"]


def alone_ratios(overlap: dict[str, Any], step: StepCost) -> dict[str, float]:
    """Per band of one point's ``host_overlap``: the decode steps alone's mean seconds over
    ``step`` (a profile's, the engine alone) at their mean rows and context."""
    return {name: served / profiled for name, profiled, served, _ in _alone_bands(overlap, step)}


def decode_alone_pairs(overlap: dict[str, Any], step: StepCost) -> list[tuple[float, float, int]]:
    """(profiled, served mean seconds, steps) of one point's decode steps alone, per band."""
    return [(profiled, served, n) for _, profiled, served, n in _alone_bands(overlap, step)]


def decode_local_pairs(overlap: dict[str, Any], step: StepCost) -> list[tuple[float, float, int]]:
    """(profiled, served seconds, 1) of one point's decode steps with a local prefill's chunk
    and no prefill step beside them: the simulator's step (tandem/planner/sim/decode.py) for the
    logged rows and prompt tokens, taking the chunk as a whole prompt (the chat prompts a
    decode worker prefills fit one step) so the rows' context is the rest of the logged one."""
    return [(step.step_s(rows, tokens, max(context - tokens, 0), tokens * (tokens + 1) // 2),
             seconds, 1)
            for rows, tokens, context, seconds in overlap.get("local_alone_steps", ())]


def _prefill_step_s(step: StepCost, tokens: int, context: int) -> float:
    """The simulator's step (tandem/planner/sim/prefill.py) for a logged prefill step: its prompt
    tokens after ``context - tokens`` computed ones, causal pairs included."""
    done = max(context - tokens, 0)
    return step.step_s(0, tokens, 0, tokens * done + tokens * (tokens + 1) // 2)


def prefill_alone_pairs(overlap: dict[str, Any], step: StepCost) -> list[tuple[float, float, int]]:
    """(profiled, served seconds, 1) of one point's prefill steps alone (the profiled step
    is the simulator's, ``_prefill_step_s``)."""
    return [(_prefill_step_s(step, tokens, context), seconds, 1)
            for tokens, context, seconds in overlap["prefill"].get("alone_steps", ())]


# Prompt tokens of a prefill step pooled for a factor by length: (fewest, most).
PROMPT_BANDS = ((1, 64), (65, 256), (257, 1024), (1025, 1 << 30))
MIN_BAND_STEPS = 4  # shared prefill steps a prompt band needs (over all points) for a factor


def partly_factor(ratio: float, share: float) -> float | None:
    """The slowdown a prefill step ``ratio`` times its time alone implies when ``share`` of
    its served time ran under decode steps, in the simulator's model (tandem/planner/sim/host.py:
    the step's work goes at 1 / factor while its peer steps): ``1/ratio = 1 - share +
    share/factor``. None when no factor explains it (noise: slower than all-shared at
    any factor would allow)."""
    rest = share - 1.0 + 1.0 / ratio
    return share / rest if rest > 0 else None


def prefill_length_table(points: Sequence[dict[str, Any]], step: StepCost,
                         fit: ServedFit | None) -> tuple[tuple[int, float], ...] | None:
    """The prefill factor by prompt length from several points' ``host_overlap``: each
    shared step's served seconds over what the same step takes alone under serving (``fit``
    of the steps alone against the profile's ``step``; the profile's itself without one),
    pooled by PROMPT_BANDS: ``((the band's median tokens, the median factor), ...)`` for the
    bands with MIN_BAND_STEPS or more steps (factors under 1 count as 1); None for none.
    A step partly under decode steps (``partly_steps``; older sweeps lack them) gives the
    factor its ratio implies (``partly_factor``): a long prefill is seldom more than 95%
    under decode steps, the gaps between them alone leave 3-5% uncovered (measured: steps of
    513-1,200 tokens, 1 such step against 21 between half and 95%; where both kinds were
    many, the two agreed: 1.63 and 1.63, 1.47 and 1.53).

    The single served factor (``served_sharing``) is a ratio of per-token medians, which
    short chat prompts dominate; against the steps alone, short prompts' steps beside decode
    steps took ~1.0x, 65-256 tokens 1.2x, longer ones 1.3-1.5x (2-core CPU box)."""
    bands: dict[int, list[tuple[int, float]]] = {}

    def add(tokens: int, context: int, seconds: float, share: float) -> None:
        alone = _prefill_step_s(step, tokens, context)
        if fit is not None:
            alone = fit.scale * alone + fit.overhead_s
        factor = partly_factor(seconds / alone, share)
        if factor is not None:
            band = next(i for i, (lo, hi) in enumerate(PROMPT_BANDS) if lo <= tokens <= hi)
            bands.setdefault(band, []).append((tokens, factor))

    for point in points:
        for tokens, context, seconds in point["prefill"].get("shared_steps", ()):
            add(tokens, context, seconds, 1.0)
        for tokens, context, seconds, share in point["prefill"].get("partly_steps", ()):
            add(tokens, context, seconds, share)
    table = [(int(statistics.median(t for t, _ in steps)),
              max(statistics.median(f for _, f in steps), 1.0))
             for _, steps in sorted(bands.items()) if len(steps) >= MIN_BAND_STEPS]
    return tuple(table) or None


@dataclass(frozen=True, slots=True)
class ServedFit:
    """A worker's served steps against its profile's: ``served = scale x profiled +
    overhead_s``, fitted over ``steps`` steps."""

    scale: float
    overhead_s: float
    steps: int

    def flag(self) -> str:
        return f"x{self.scale:.3f} + {self.overhead_s * 1e3:.1f} ms ({self.steps} steps)"


def scale_fit(pairs: Sequence[tuple[float, float, int]]) -> ServedFit | None:
    """Least squares of served on profiled seconds through the origin, each pair weighted by
    its steps: a scale, no overhead. None without pairs of positive length."""
    sxx = sum(n * x * x for x, _, n in pairs)
    if sxx <= 0:
        return None
    return ServedFit(sum(n * x * y for x, y, n in pairs) / sxx, 0.0, sum(n for *_, n in pairs))


def fit_served(pairs: Sequence[tuple[float, float, int]]) -> ServedFit | None:
    """Least squares of served on profiled seconds, each pair weighted by its steps; the
    overhead kept >= 0 (refitted through the origin otherwise). None without two distinct
    profiled lengths."""
    w = sum(n for *_, n in pairs)
    if len({round(x, 9) for x, _, _ in pairs}) < 2 or w <= 0:
        return None
    mx = sum(x * n for x, _, n in pairs) / w
    my = sum(y * n for _, y, n in pairs) / w
    sxx = sum(n * (x - mx) ** 2 for x, _, n in pairs)
    sxy = sum(n * (x - mx) * (y - my) for x, y, n in pairs)
    scale = sxy / sxx
    overhead = my - scale * mx
    if overhead < 0 or scale <= 0:
        return scale_fit(pairs)
    return ServedFit(scale, overhead, int(w))


def prefill_served_fit(points: Sequence[dict[str, Any]], prefill: StepCost) -> ServedFit | None:
    """The prefill worker's ``fit_served`` pooled over several points' ``host_overlap`` (its
    steps with no decode step beside them)."""
    return fit_served([p for o in points for p in prefill_alone_pairs(o, prefill)])


def prompt_scale_fit(pairs: Sequence[tuple[float, float, int]], decode: ServedFit
                     ) -> ServedFit | None:
    """The decode worker's steps with a local prompt chunk (``decode_local_pairs``) against
    what its decode steps' fit gives the same steps (``decode``: scale x profiled +
    overhead), as a ``scale_fit``: its scale is the profile's ``serving_prompt_scale``.
    None without such steps."""
    return scale_fit([(decode.scale * x + decode.overhead_s, y, n) for x, y, n in pairs])


def served_fits(points: Sequence[dict[str, Any]], decode: StepCost,
                prefill: StepCost) -> dict[str, ServedFit | None]:
    """The workers' ``fit_served`` pooled over several points' ``host_overlap`` (their steps
    with no step of the other worker beside them): ``decode`` of the decode worker's decode
    steps, ``prompt`` of its steps with a local prompt chunk against that fit
    (``prompt_scale_fit``; the step logs lay them out), ``prefill`` of the prefill worker's
    steps.

    Two fits for the decode worker because its two kinds of step stray from the one-thread
    profile in opposite directions: measured on the 2-core CPU box, its decode steps ran
    0.96x the profile and its prompt steps 1.28x (1.1x at 32-47 tokens, 1.26-1.36x at
    48-95). One fit over both (x1.07) priced the simulated decode steps 1.12x too dear and
    the local prefills 1.19x too cheap, so the simulated router kept more prompts local (the
    mixed load at 0.8 req/s: 91% of chat-sized prompts against 58%) and its TPOT ran high
    (1.40x). Fitted on decode steps alone with the profile's prompt costs as they were, the
    error ran the other way."""
    alone = [p for o in points for p in decode_alone_pairs(o, decode)]
    local = [p for o in points for p in decode_local_pairs(o, decode)]
    fit = fit_served(alone) or scale_fit(alone)  # one batch size alone: a scale only
    if fit is None:  # no decode steps alone: its prompt steps are all there is
        fit, local = fit_served(local) or scale_fit(local), []
    return {"decode": fit,
            "prompt": prompt_scale_fit(local, fit) if fit is not None else None,
            "prefill": prefill_served_fit(points, prefill)}


def overlap_table(rows: Sequence[tuple[str, str, float, dict[str, Any]]]) -> str:
    """(setup, mix, rate, host_overlap) rows as text: the shares of each worker's stepping
    time under the other's steps, the decode factor by band and the prefill factor (``-``
    where a point has too few steps alone or shared)."""
    names = list(BAND_ROWS)
    lines = [f"{'setup':14s} {'mix':6s} {'rate':>5s} {'decode/prefill shared':>22s} "
             + " ".join(f"{n + ' rows':>10s}" for n in names) + f" {'prefill':>8s}"]

    def cell(c: dict[str, Any] | None, width: int) -> str:
        if c is None or not _usable(c):
            return "-".rjust(width)
        return f"{c['factor']:{width}.2f}"

    for setup, mix, rate, o in rows:
        lines.append(f"{setup:14s} {mix:6s} {rate:5.2f} "
                     f"{o['decode_shared']:10.0%} / {o['prefill_shared']:4.0%}     "
                     + " ".join(cell(o["bands"].get(n), 10) for n in names)
                     + f" {cell(o['prefill'], 8)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Recompute the ``host_overlap`` of every point of a sweep from the step logs it kept
    (``scripts/bench_serve --sweep ... --out DIR``: DIR/steps-<setup>/), e.g. after this
    module learnt a new figure; writes the sweep file back."""
    p = argparse.ArgumentParser(prog="python -m bench.serving.step_overlap", description=main.__doc__)
    p.add_argument("sweep", type=Path, help="serve_sweep.json")
    p.add_argument("--steps", type=Path, default=None,
                   help="the folder holding steps-<setup>/ (default: the sweep file's)")
    args = p.parse_args(argv)
    folder = args.steps or args.sweep.parent
    sweep = json.loads(args.sweep.read_text())
    redone = 0
    for setup, points in sweep["summaries"].items():
        logs = folder / f"steps-{setup}"
        for point in points.values():
            if "host_overlap" not in point:
                continue
            since, until = point["host_overlap"]["window"]
            prefill = logs / "prefill.jsonl"  # none for a colocated setup: all steps alone
            point["host_overlap"] = host_overlap(
                read_step_log(logs / "decode.jsonl", since, until),
                read_step_log(prefill, since, until) if prefill.exists() else ()
            ) | {"window": [since, until]}
            redone += 1
    args.sweep.write_text(json.dumps(sweep, indent=1))
    print(f"{redone} points' host_overlap recomputed from {folder}/steps-*/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
