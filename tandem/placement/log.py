"""The router's placement log (``--placement-log FILE``): one line per placement decision with
the inputs it was made from, for explaining where prompts went.

    prefill_placement.place ──placement_record(...)──> PlacementLog.write
        ──> FILE, one JSON object a line, appended:
            {"t": wall-clock seconds, "tokens": prompt tokens, "decision", "reason",
             "endpoint": the chosen prefill worker ("" when local),
             "local": {"ttft_s", "gap_s", "overhead_s"} or null, the local option's
                      prediction (``overhead_s``: the decode worker's learnt extra in it),
             "decode": {"endpoint", "running" (reported), "active" (the router's count),
                        "base_s", "per_row_s", "per_token_s", "queued", "cached"},
             "prefill": [{"endpoint", "base_s", "per_token_s", "queued", "cached",
                          "overhead_s", "link_s", "ttft_s", "gap_s"}, ...]  (the weighed
                        candidates; ``link_s``: the push priced on the link to D, link.py)}

``tandem_disagg_decision_total`` counts decisions; the log keeps each one's inputs (the
workers' reported step-cost fits, their queues, the overheads the router has learnt, the
cached prefixes) and both options' predicted TTFT and decode token gap, so a placement
that surprises (a whole load kept local, say) can be traced to
the numbers behind it. The simulator's router builds the same records (tandem/planner/sim/placing.py)
for the same comparison. Off by default; one ``write`` per decision, line-sized and appended
with ``O_APPEND``; the file is created private (0600) and grows until the operator removes it.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem.placement import cost_model
from tandem.placement.cost_model import Placement
from tandem.placement.worker_view import WorkerView


def placement_record(t: float, prompt_tokens: int, decode: WorkerView,
                     prefill: Sequence[WorkerView], cached: Mapping[str, int],
                     overhead_s: Mapping[str, float], placed: Placement,
                     link_s: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One decision and its inputs as a JSON-able dict (the module docstring's fields);
    ``t``: when (wall clock, or simulated seconds). The predictions are the ones
    cost_model.decide compared (cost_model.weigh)."""
    links = link_s or {}
    remote, local = cost_model.weigh(prompt_tokens, decode, prefill, cached, overhead_s, links)
    candidates = []
    for p, pred in remote:
        candidates.append({
            "endpoint": p.endpoint, "base_s": p.step_base_s,
            "per_token_s": p.step_per_prefill_token_s, "queued": p.queued_prefill_tokens,
            "cached": cached.get(p.endpoint, 0), "overhead_s": overhead_s.get(p.endpoint, 0.0),
            "link_s": links.get(p.endpoint, 0.0),
            "ttft_s": None if pred is None else pred.ttft_s,
            "gap_s": None if pred is None else pred.decode_gap_s,
        })
    return {
        "t": round(t, 6), "tokens": prompt_tokens, "decision": placed.decision.value,
        "reason": placed.reason.value, "endpoint": placed.endpoint,
        "local": None if local is None else {"ttft_s": local.ttft_s,
                                             "gap_s": local.decode_gap_s,
                                             "overhead_s": local.overhead_s},
        "decode": {"endpoint": decode.endpoint, "running": decode.num_running,
                   "active": decode.active,
                   "base_s": decode.step_base_s, "per_row_s": decode.step_per_row_s,
                   "per_token_s": decode.step_per_prefill_token_s,
                   "queued": decode.queued_prefill_tokens,
                   "cached": cached.get(decode.endpoint, 0)},
        "prefill": candidates,
    }


class PlacementLog:
    """Appends one record line to ``path`` per :meth:`write` (one ``os.write`` each)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (placement_record's dict) as one line."""
        if self._fd is not None:
            os.write(self._fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        """Stop logging; later records are dropped."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_placement_log(path: str | Path) -> list[dict[str, Any]]:
    """The records in ``path``, in file order (a last line still being written is skipped);
    a line that is not a JSON object raises ValueError naming it."""
    out = []
    lines = Path(path).read_text().split("\n")
    for number, line in enumerate(lines[:-1], 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a placement record: {line[:80]!r}") from exc
        if not isinstance(record, dict) or "decision" not in record:
            raise ValueError(f"{path}:{number}: not a placement record: {line[:80]!r}")
        out.append(record)
    return out


MODEL_REASONS = ("slo", "cheapest")  # decisions the placement model made
# summarize_placements' figures: name -> how to read it from a record (None: not there).
_FIGURES: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    "local_ttft_s": lambda r: (r["local"] or {}).get("ttft_s"),
    "remote_ttft_s": lambda r: r["prefill"][0]["ttft_s"] if r["prefill"] else None,
    "overhead_s": lambda r: r["prefill"][0]["overhead_s"] if r["prefill"] else None,
    "link_s": lambda r: r["prefill"][0].get("link_s") if r["prefill"] else None,
    "local_overhead_s": lambda r: (r["local"] or {}).get("overhead_s"),
    "decode_base_s": lambda r: r["decode"]["base_s"],
    "decode_per_token_s": lambda r: r["decode"]["per_token_s"],
    "prefill_base_s": lambda r: r["prefill"][0]["base_s"] if r["prefill"] else None,
    "prefill_per_token_s": lambda r: r["prefill"][0]["per_token_s"] if r["prefill"] else None,
    "prefill_queued": lambda r: r["prefill"][0]["queued"] if r["prefill"] else None,
}
FIGURES = tuple(_FIGURES)


def summarize_placements(records: Sequence[Mapping[str, Any]],
                         max_tokens: int | None = None) -> dict[str, float | None]:
    """What a run's placement model saw, in medians over the decisions it made (reason
    ``slo`` or ``cheapest``; of prompts of at most ``max_tokens`` tokens when given):
    ``decisions``, ``local_share`` and each of :data:`FIGURES` (the local and first remote
    option's predicted TTFT, the learnt overheads (remote, local), the two workers' reported
    fits, the prefill queue). None where no record had a value."""
    rows = [r for r in records if r["reason"] in MODEL_REASONS
            and (max_tokens is None or r["tokens"] <= max_tokens)]
    out: dict[str, float | None] = {
        "decisions": float(len(rows)),
        "local_share": (sum(r["decision"] == "local" for r in rows) / len(rows)) if rows else None,
    }
    for name, read in _FIGURES.items():
        values = [v for v in (read(r) for r in rows) if v is not None]
        out[name] = statistics.median(values) if values else None
    return out
