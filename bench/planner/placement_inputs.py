"""What the placement model saw at a sweep point, real and simulated, side by side.

    real router --placement-log--> records ─┐
                                            ├─ placement_inputs ─> {"all": ..., "chat": ...}
    simulated router (same records) ────────┘                    └─> placement_table

A real run's decisions and a simulated one's can differ (a real adaptive router has kept
chat prompts local that the simulated one sent remote) while both run the same placement
code; the difference is in its inputs. Per point this gives the
medians of each input (tandem/placement/log.summarize_placements: the local and
remote options' predicted TTFT, the remote overhead learnt, both workers' fitted step costs,
the prefill queue) over all prompts and over chat-sized ones, for the real and the simulated
router, so the table shows which input differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tandem.placement.log import FIGURES, summarize_placements

CHAT_TOKENS = 256  # chat turns: the chat kind's 32-96 tokens plus a system prompt (RAG: 768+)
_SHOWN = ("local_share", *FIGURES)


def remote_extra_s(seen: Mapping[str, Any]) -> float | None:
    """What a router added to a remote option's compute in ``seen`` (one side's medians): its
    learnt overhead plus the push priced on the link (``link_s``; a router that did not price
    links, as in recordings made before it did, learnt the push into its overhead)."""
    if seen.get("overhead_s") is None:
        return None
    return seen["overhead_s"] + (seen.get("link_s") or 0.0)


def placement_inputs(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Medians of the model's inputs over all prompts and chat-sized ones; None when the
    model made no decision (all remote on no signal, or placement configured)."""
    every = summarize_placements(records)
    if not every["decisions"]:
        return None
    return {"all": every, "chat": summarize_placements(records, CHAT_TOKENS)}


def placement_table(rows: Sequence[Mapping[str, Any]], which: str = "chat") -> str:
    """Per point with both sides' inputs: real / simulated for each figure (seconds in ms);
    "" when no row has both."""
    lines = []
    for row in rows:
        seen = row.get("placement_inputs") or {}
        real, sim = (seen.get("real") or {}).get(which), (seen.get("sim") or {}).get(which)
        if not real or not sim:
            continue
        cells = []
        for name in _SHOWN:
            scale = 1e3 if name.endswith("_s") else 1.0
            a, b = real.get(name), sim.get(name)
            fmt = "{:.0%}" if name == "local_share" else "{:.1f}" if scale == 1e3 else "{:.0f}"
            cells.append("/".join("-" if v is None else fmt.format(v * scale) for v in (a, b)))
        lines.append(f"{row['setup']:<14} {row['mix']:<7} {row['rate']:>5.2f}  "
                     + "  ".join(f"{c:>13}" for c in cells))
    if not lines:
        return ""
    head = (f"{'setup':<14} {'mix':<7} {'rate':>5}  "
            + "  ".join(f"{n.removesuffix('_s'):>13}" for n in _SHOWN))
    return "\n".join([head, *lines])
