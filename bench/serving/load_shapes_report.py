"""bench/serving/load_shapes.py's table, markdown page and plot."""

from __future__ import annotations

from pathlib import Path

COLUMNS = ("output tok/s", "ITL p50 ms", "TTFT p50 s", "errors", "tok/s per round")


def _cells(f: dict) -> list[str]:
    if "error" in f:
        return ["failed", "-", "-", f["error"][:60], ""]
    rounds = f.get("rounds_tok_s", [])
    return [f"{f['output_tok_s']:.1f}", f"{f['itl_p50_ms']:.0f}", f"{f['ttft_p50_s']:.2f}",
            str(f["errors"]), " / ".join(f"{x:.0f}" for x in rounds) if len(rounds) > 1 else ""]


def _ratio_lines(r: dict) -> list[str]:
    each = r.get("rounds_default_vs_best_tok_s", [])
    rounds = (" (rounds: " + ", ".join(
        f"{x:.2f}x of {c}" for x, c in zip(each, r["rounds_best_tok_s_config"], strict=True)) + ")"
              if len(each) > 1 else "")
    lines = [f"default / best Tandem ({r['best_tok_s_config']}): "
             f"{r['default_vs_best_tok_s']:.2f}x output tok/s{rounds}; ITL p50 best "
             f"({r['best_itl_config']}) / default: {r['default_vs_best_itl']:.2f}x"]
    if "default_vs_llama_tok_s" in r:
        lines.append(f"default / llama-server: {r['default_vs_llama_tok_s']:.2f}x output tok/s, "
                     f"{r['default_vs_llama_itl']:.2f}x lower ITL p50")
    return lines


def table(results: dict) -> str:
    """Plain text: a block per shape, a row per configuration, then the ratios."""
    out = []
    for shape, rows in results["rows"].items():
        out.append(f"\n{shape}")
        out.append(f"  {'config':15s}" + "".join(f"{c:>16s}" for c in COLUMNS))
        for config, f in rows.items():
            out.append(f"  {config:15s}" + "".join(f"{c:>16s}" for c in _cells(f)))
        if shape in results["ratios"]:
            out += ["  " + line for line in _ratio_lines(results["ratios"][shape])]
    return "\n".join(out)


def markdown(results: dict) -> str:
    """The tables as markdown (a page's "latest result" section)."""
    m = results["machine"]
    out = [f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads per server, Python "
           f"{m['python']}, {m['date']}. Command: `{results['command']}`.", ""]
    for shape, rows in results["rows"].items():
        out += [f"**{shape}**", "", "| configuration | " + " | ".join(COLUMNS) + " |",
                "|---|" + "---:|" * len(COLUMNS)]
        out += [f"| {config} | " + " | ".join(_cells(f)) + " |" for config, f in rows.items()]
        if shape in results["ratios"]:
            out += [""] + [f"- {line}" for line in _ratio_lines(results["ratios"][shape])]
        out.append("")
    return "\n".join(out)


def plot(results: dict, path: Path) -> None:
    """Output tok/s and ITL p50 per configuration, a panel pair per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(results["rows"])
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 6.4), squeeze=False)
    for col, shape in enumerate(shapes):
        rows = {c: f for c, f in results["rows"][shape].items() if "error" not in f}
        names = list(rows)
        colors = ["tab:orange" if n == "llama-server" else
                  "tab:blue" if n == "default" else "tab:gray" for n in names]
        for row, (key, label) in enumerate((("output_tok_s", "output tok/s (higher is better)"),
                                            ("itl_p50_ms", "ITL p50, ms (lower is better)"))):
            ax = axes[row][col]
            ax.bar(range(len(names)), [rows[n][key] for n in names], color=colors)
            ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            if row == 0:
                ax.set_title(shape)
            if key == "itl_p50_ms":
                ax.set_yscale("log")
    fig.suptitle("tandem local configurations and llama-server, same GGUF and cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
