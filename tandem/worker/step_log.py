"""A worker's step log (``--step-log FILE``): one line per model step, for measuring what
steps cost under serving.

    engine thread ──LLMEngine.step_costs.observer(rows, tokens, context, seconds)──> StepLog.record
        ──> FILE, one JSON object a line, appended:
            {"start": wall-clock seconds, "s": seconds, "rows": decode rows,
             "tokens": prompt tokens, "context": tokens attended (every query's own context)}

/metrics sums steps (how many, seconds stepping); the log keeps each one with its wall-clock
start, so two workers' logs on one host can be laid side by side: which decode steps ran while
the prefill worker computed, and how much longer they took (bench/serving/step_overlap.py, read by
``scripts/bench_serve``'s sweep). Off by default; one ``write`` per step (line-sized, appended
with ``O_APPEND``, so a reader never sees half a line but the one being written), a few
microseconds against steps of milliseconds. The file is created private (0600) and grows
until the operator removes it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import NamedTuple


class StepRecord(NamedTuple):
    """One model step: its wall-clock start (``time.time()`` seconds), how long it ran, its
    decode rows (one-token queries), its prompt tokens (chunks of more than one token) and
    its context: the tokens in the KV cache its queries attend to, summed over its requests
    (a row's context is its sequence's length)."""

    start: float
    seconds: float
    rows: int
    tokens: int
    context: int = 0

    @property
    def end(self) -> float:
        """When it ended (wall clock)."""
        return self.start + self.seconds


class StepLog:
    """Appends a :class:`StepRecord` line to ``path`` per :meth:`record` (thread-safe: one
    ``os.write`` each)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def record(self, rows: int, tokens: int, context: int, seconds: float) -> None:
        """A step of ``rows`` decode rows and ``tokens`` prompt tokens over ``context``
        tokens just ended after ``seconds`` (the signature of ``StepCostFeed.observer``, tandem/engine/step_cost_feed.py)."""
        if self._fd is None:
            return
        line = json.dumps({"start": round(time.time() - seconds, 6), "s": round(seconds, 6),
                           "rows": rows, "tokens": tokens, "context": context})
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        """Stop logging; later records are dropped."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_step_log(path: str | Path, since: float = -math.inf,
                  until: float = math.inf) -> list[StepRecord]:
    """The steps logged in ``path`` that started at or after ``since`` and ended by ``until``
    (wall clock), in file order. A last line still being written is skipped; any other line
    that is not a record raises ValueError naming the line."""
    out = []
    lines = Path(path).read_text().split("\n")
    for number, line in enumerate(lines[:-1], 1):  # the text after the last newline: unfinished
        try:
            d = json.loads(line)
            rec = StepRecord(float(d["start"]), float(d["s"]), int(d["rows"]), int(d["tokens"]),
                             int(d["context"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a step record: {line[:80]!r}") from exc
        if rec.start >= since and rec.end <= until:
            out.append(rec)
    return out
