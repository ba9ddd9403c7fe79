"""Tables and plots of serving-benchmark summaries (see tandem/loadgen/stats.py) and of rate
sweeps (tandem/loadgen/sweep.py); matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tandem.loadgen.stats import RequestResult
from tandem.loadgen.sweep import TARGET, MaxRate, max_rate

# setup -> mix -> [(rate, SLO attainment)]
Curves = dict[str, dict[str, list[tuple[float, float]]]]
# (row title, numerator setup, denominator setup) of the sweep table's ratio rows
RATIOS = (("adaptive/colocated", "disagg", "colocated"),
          ("remote/colocated", "disagg-remote", "colocated"))

_ROWS = (
    ("TTFT", "ttft"),
    ("TPOT", "tpot"),
    ("ITL", "itl"),
    ("E2E", "e2e"),
)


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def table(summaries: dict[str, dict]) -> str:
    """A Markdown table, one column per labelled summary: latencies in ms, rates per second."""
    labels = list(summaries)
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, key in _ROWS:
        for q in ("p50", "p90", "p99"):
            cells = [_ms(summaries[lab][key][q]) for lab in labels]
            lines.append(f"| {name} {q} (ms) | " + " | ".join(cells) + " |")

    def row(title: str, fmt: str, key: str) -> None:
        lines.append(f"| {title} | " + " | ".join(fmt.format(summaries[lab][key]) for lab in labels)
                     + " |")

    row("requests sent", "{}", "requests")
    row("completed", "{}", "completed")
    row("throughput (req/s)", "{:.3f}", "throughput_rps")
    row("output tokens/s", "{:.1f}", "output_tok_s")
    row("goodput (req/s)", "{:.3f}", "goodput_rps")
    row("goodput share", "{:.0%}", "goodput_share")
    return "\n".join(lines)


def plot(runs: dict[str, list[RequestResult]], out: Path, title: str = "") -> None:
    """PNG: empirical CDFs of TTFT, TPOT and ITL, one line per labelled run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for label, results in runs.items():
        ok = [r for r in results if r.ok]
        series = {
            "TTFT (s)": [r.ttft for r in ok],
            "TPOT (ms)": [t * 1000 for r in ok if (t := r.tpot) is not None],
            "ITL (ms)": [g * 1000 for r in ok for g in r.itls],
        }
        for ax, (name, values) in zip(axes, series.items(), strict=True):
            values = sorted(values)
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=label)
            ax.set_xlabel(name)
            ax.set_ylabel("fraction of requests" if name != "ITL (ms)" else "fraction of gaps")
            ax.grid(alpha=0.3)
    for ax in axes:
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.legend(fontsize=8)
    _save(fig, out, title)


def _capacity(m: MaxRate, top: float) -> str:
    if m.all_miss:
        return "0 (all miss)"
    if m.interpolated is not None:
        return f"{m.rate:g} (~{m.interpolated:.2f})"
    return f">= {m.rate:g}" if m.rate == top else f"{m.rate:g}"


def sweep_table(curves: Curves, ratios: Sequence[tuple[str, str, str]] = RATIOS) -> str:
    """Markdown: per setup and mix, the highest rate at 90% attainment and the curve itself.

    Cells read ``0.4 (~0.47) [0.2: 100%, 0.4: 93%, 0.6: 70%]``: the highest swept rate that
    reached the target, the interpolated crossing, then attainment at each swept rate. Ratio
    rows divide the interpolated capacities where there are any (the swept ones in brackets).
    """
    setups = list(curves)
    mixes = list(dict.fromkeys(m for s in setups for m in curves[s]))
    caps = {s: {m: max_rate(c) for m, c in curves[s].items()} for s in setups}
    lines = [f"| setup (req/s at {TARGET:.0%} SLO attainment) | " + " | ".join(mixes) + " |",
             "|---|" + "---|" * len(mixes)]
    for s in setups:
        cells = []
        for m in mixes:
            curve = sorted(curves[s].get(m, []))
            if not curve:
                cells.append("-")
                continue
            at = ", ".join(f"{r:g}: {a:.0%}" for r, a in curve)
            cells.append(f"{_capacity(caps[s][m], curve[-1][0])} [{at}]")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    for title, num, den in ratios:
        if num not in caps or den not in caps:
            continue
        cells = []
        for m in mixes:
            a, b = caps[num].get(m), caps[den].get(m)
            if a is None or b is None or b.estimate <= 0:
                cells.append("-")
                continue
            swept = f" ({a.rate / b.rate:.2f})" if b.rate > 0 else ""
            cells.append(f"{a.estimate / b.estimate:.2f}{swept}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def turn_table(by_turn: dict[str, dict[int, dict[str, float]]]) -> str:
    """Markdown: per setup and turn index, the share of prompt tokens the prefix cache served."""
    turns = sorted({t for stats in by_turn.values() for t in stats})
    lines = ["| setup (cached / prompt tokens) | " + " | ".join(f"turn {t}" for t in turns)
             + " |", "|---|" + "---:|" * len(turns)]
    for setup, stats in by_turn.items():
        cells = [
            f"{st['cached_share']:.0%} ({st['cached_tokens']:.0f}/{st['prompt_tokens']:.0f})"
            if (st := stats.get(t)) else "-"
            for t in turns
        ]
        lines.append(f"| {setup} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweep(curves: Curves, out: Path, title: str = "") -> None:
    """PNG: SLO attainment vs offered rate, one subplot per mix, one line per setup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(dict.fromkeys(m for per_mix in curves.values() for m in per_mix))
    fig, axes = plt.subplots(1, len(mixes), figsize=(4.6 * len(mixes), 4.0), squeeze=False)
    styles = [("o", "-", 7), ("s", "--", 6), ("^", ":", 5), ("D", "-.", 4)]  # overlaps show
    for ax, mix in zip(axes[0], mixes, strict=True):
        for i, (setup, per_mix) in enumerate(curves.items()):
            marker, line, size = styles[i % len(styles)]
            if curve := sorted(per_mix.get(mix, [])):
                ax.plot([r for r, _ in curve], [a for _, a in curve], marker=marker, ls=line,
                        ms=size, label=setup)
        ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
        ax.set_ylim(0, 1.05)
        ax.set_title(mix)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("SLO attainment")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, out, title)


def _save(fig: Any, out: Path, title: str) -> None:
    """Title (if any), tight layout, write ``out``, free the figure."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
