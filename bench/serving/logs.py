"""Where scripts/bench_serve keeps a setup's logs, and one point's window of them, read once.

    OUT/steps-<setup>/                 steps_dir
        prefill.jsonl, decode.jsonl    the workers' --step-log   (step_log_path)
        router_placements.jsonl        the router's --placement-log (placement_log_path)

A sweep point's summary takes three things from these (bench_serve.log_summaries): the host
overlap of the two workers' steps, the placement model's inputs, and where each placed
prefill's time went; :func:`read_point_logs` reads each file once for all three.
bench/serving/prefill_residuals.py reads a finished sweep's folder the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

from tandem.placement.log import read_placement_log
from tandem.worker.step_log import StepRecord, read_step_log


def steps_dir(out: Path, setup: str) -> Path:
    """The folder of ``setup``'s logs under a sweep's ``--out`` folder."""
    return out / f"steps-{setup}"


def step_log_path(folder: Path, role: str) -> Path:
    """Where a setup's ``role`` worker logs its steps in ``folder``."""
    return folder / f"{role}.jsonl"


def placement_log_path(folder: Path) -> Path:
    """Where a setup's router logs its placement decisions in ``folder``."""
    return folder / "router_placements.jsonl"


class PointLogs(NamedTuple):
    """One window of a setup's logs; None for a log the setup does not keep."""

    prefill: list[StepRecord] | None
    decode: list[StepRecord] | None
    placements: list[dict[str, Any]] | None


def read_point_logs(folder: Path, since: float = -math.inf, until: float = math.inf
                    ) -> PointLogs:
    """The steps that ran and the decisions made between ``since`` and ``until`` (wall
    clock) in ``folder``'s logs."""
    def steps(role: str) -> list[StepRecord] | None:
        path = step_log_path(folder, role)
        return read_step_log(path, since, until) if path.exists() else None

    path = placement_log_path(folder)
    placements = ([r for r in read_placement_log(path) if since <= r["t"] <= until]
                  if path.exists() else None)
    return PointLogs(steps("prefill"), steps("decode"), placements)
