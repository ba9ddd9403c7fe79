"""Table, Markdown and bar chart of bench/vs_llama_cpp/compare.py's rows (ours / llama.cpp)."""

from __future__ import annotations

from pathlib import Path


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _cells(r: dict) -> tuple[str, str]:
    """(ours, llama.cpp) as shown: ms/token for latency rows, tokens/s for the rest."""
    if r["ours_ms"] is not None or r["theirs_ms"] is not None:
        return _num(r["ours_ms"], "{:.2f} ms/tok"), _num(r["theirs_ms"], "{:.2f} ms/tok")
    return _num(r["ours"], "{:.1f} tok/s"), _num(r["theirs"], "{:.1f} tok/s")


def table(rows: list[dict]) -> str:
    """Plain-text table: one line per row, tokens/s on both sides, ratio against target."""
    head = f"{'row':38s} {'ours':>15s} {'llama.cpp':>15s} {'ratio':>7s} {'target':>7s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ours, theirs = _cells(r)
        ratio = _num(r["ratio"], "{:.2f}x")
        mark = "" if r["ratio"] is None else (" ok" if r["ratio"] >= r["target"] else " MISS")
        lines.append(f"{r['label']:38s} {ours:>15s} {theirs:>15s} {ratio:>7s} "
                     f"{r['target']:>6.1f}x{mark}")
    lines.append("ratio = ours / llama.cpp in tokens/s (for ms/token rows: theirs / ours): "
                 "higher is better")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The Markdown report: what ran, where, and the table."""
    m = results["machine"]
    lc = results["llama_cpp"] or {}
    out = [
        "# Tandem vs llama.cpp: same GGUF, same threads, same run",
        "",
        f"Command: `{results['command']}`",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores visible, {m['memory_gb']:.0f} GB RAM; "
        f"Python {m['python']}, torch {m['torch']}; Tandem's native kernels: "
        f"{m.get('native_isa', 'not recorded')}",
        f"- Tandem commit: {m['commit']}",
        f"- Model: `{results['gguf']}`",
        f"- Threads: {results['threads']} on both sides (HTTP rows: both servers on the same "
        f"{results['threads']} cores; Tandem as `tandem local` splits them itself: "
        f"{results.get('tandem_local_threads', '?')})",
        f"- llama.cpp: {lc.get('version', 'not run')} ({lc.get('found_in', '-')})",
        f"- Plan: {results['plan']}",
        "",
        "| row | ours | llama.cpp | ours / llama.cpp | target |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        ours, theirs = _cells(r)
        ratio = _num(r["ratio"], "{:.2f}x")
        met = "" if r["ratio"] is None else (" (met)" if r["ratio"] >= r["target"] else "")
        out.append(f"| {r['label']} | {ours} | {theirs} | {ratio}{met} | {r['target']:.1f}x |")
    out += ["", "Ratios are in tokens/s, higher is better (ms/token rows: llama.cpp's ms over "
            "ours). Engine rows: our `engine.LLM` in this process vs llama-bench / "
            "llama-batched-bench; HTTP rows: one streaming `/v1/completions` client against "
            "`tandem local` and llama-server."]
    if results.get("notes"):
        out += ["", "Notes:", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(out) + "\n"


def plot(results: dict, out: Path) -> None:
    """Bars of ours / llama.cpp per row, each with its target marked, parity at 1.0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = list(range(len(rows)))
    ratios = [r["ratio"] or 0.0 for r in rows]
    colors = ["tab:green" if r["ratio"] and r["ratio"] >= r["target"] else "tab:orange"
              for r in rows]
    ax.bar(x, ratios, 0.6, color=colors)
    for i, r in enumerate(rows):
        ax.hlines(r["target"], i - 0.4, i + 0.4, colors="k", linestyles="--", linewidth=1.5)
        label = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        ax.text(i, max(ratios[i], 0.02) + 0.03, label, ha="center", va="bottom", fontsize=9)
    for level in sorted({r["target"] for r in rows}):
        ax.axhline(level, color="grey", linewidth=0.5, alpha=0.5)
        ax.text(len(rows) - 0.35, level, f"{level:.1f}x", va="center", fontsize=8, color="grey")
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xlim(-0.6, len(rows) - 0.05)  # room on the right for the target labels
    ax.set_xticks(x, [r["label"].replace(" (", "\n(") for r in rows], fontsize=8)
    ax.set_ylabel("ours / llama.cpp (tokens/s)")
    ax.set_ylim(0, max([*ratios, *(r["target"] for r in rows)]) * 1.2)
    ax.set_title(f"Tandem vs llama.cpp, {results['threads']} threads, same GGUF "
                 f"(dashed: target)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
