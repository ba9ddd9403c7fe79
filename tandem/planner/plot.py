"""The plan's picture: SLO attainment vs request rate for the winning configurations."""

from __future__ import annotations

from pathlib import Path

from tandem.planner.search import Candidate, Plan


def plot_plan(plan: Plan, path: str | Path, attainment: float, title: str = "",
              chosen: Candidate | None = None) -> None:
    """Write a PNG: one attainment curve per winner (``chosen``, the one to deploy, says so
    in the legend), the target as a line, the planned rate and each winner's goodput marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for cand, style in ((plan.disaggregated, "o-"), (plan.colocated, "s--")):
        if cand is None or not cand.curve:
            continue
        rates = [r for r, _ in cand.curve]
        share = [a * 100 for _, a in cand.curve]
        label = (f"{cand.kind}: P={cand.prefill} D={cand.decode} ({cand.gpus} GPUs)"
                 if cand.kind == "disaggregated" else
                 f"colocated: {cand.decode} workers ({cand.gpus} GPUs)")
        if cand is chosen:
            label += " - deploy"
        (line,) = ax.plot(rates, share, style, label=label)
        if cand.goodput_rps:
            ax.axvline(cand.goodput_rps, color=line.get_color(), alpha=0.3, lw=3)
    ax.axhline(attainment * 100, color="grey", ls=":", label=f"target {attainment:.0%}")
    ax.axvline(plan.rate, color="black", ls=":", lw=1, label=f"planned {plan.rate:.3g} req/s")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("requests inside TTFT and TPOT targets (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title or "tandem plan: SLO attainment vs rate (shaded: goodput)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
