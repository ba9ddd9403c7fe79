"""Tables and plots of serving-benchmark summaries (see bench/serve_stats.py)."""

from __future__ import annotations

import math
from pathlib import Path

from bench.serve_stats import RequestResult

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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
