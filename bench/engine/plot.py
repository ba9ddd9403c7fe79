"""Bar chart of bench/engine/vs_transformers.py results: ours vs transformers per workload and dtype."""

from __future__ import annotations

from pathlib import Path


def plot(results: dict, out: Path) -> None:
    """Write a PNG with one panel per metric kind (throughput, ms/token)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = list(results["dtypes"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [
        ("batch", "tok_s", "64 req x 128 out, batch 32"),
        ("mixed", "tok_s", "mixed prompts/outputs"),
        ("single", "ms_per_tok", "batch 1: ms per token"),
    ]
    for ax, (name, unit, title) in zip(axes, panels, strict=False):
        ours = [results["dtypes"][d][name][f"ours_{unit}"] for d in dtypes]
        hf = [results["dtypes"][d][name][f"hf_{unit}"] for d in dtypes]
        x = range(len(dtypes))
        ax.bar([i - 0.2 for i in x], ours, 0.4, label="tandem engine")
        ax.bar([i + 0.2 for i in x], hf, 0.4, label="transformers generate()")
        if name == "single":
            floors = [results["dtypes"][d]["single"]["floor_ms_per_tok"] for d in dtypes]
            ax.scatter(list(x), floors, color="k", marker="_", s=900, label="bandwidth floor")
        ax.set_xticks(list(x), dtypes)
        ax.set_title(title)
        ax.set_ylabel(unit.replace("_", " "))
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"engine vs transformers, {results['threads']} threads (medians of "
                 f"{results['repeats']} runs; batch/mixed: {results['heavy_repeats']})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
