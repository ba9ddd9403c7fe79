"""A request trace: what arrives when, with how many prompt and output tokens.

The simulator's input and the planner's unit of workload. Requests that share a prompt
prefix (a system prompt, an earlier turn of the conversation) name the same ``prefix_group``
and how many of their leading tokens it covers, so prefix caching and prefix-delta transfer
are modelled without token ids. Traces are written as JSON Lines (one request per line), so
a recorded production trace can be replayed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace line that is not a valid request."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: ``arrival_s`` after the trace starts, its lengths and shared prefix.

    ``prefix_group`` >= 0 says the first ``prefix_tokens`` prompt tokens equal those of every
    other request in the group that has at least as many (-1: nothing shared).
    ``conversation`` >= 0 ties the turns of one chat together (turn order = arrival order);
    a turn's prefix is then the previous turn's prompt and reply.
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    kind: str = ""
    prefix_group: int = -1
    prefix_tokens: int = 0
    conversation: int = -1

    def __post_init__(self) -> None:
        if self.arrival_s < 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise TraceError(f"bad request {self}: arrival >= 0, prompt and output >= 1")
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise TraceError(f"bad request {self}: 0 <= prefix_tokens <= prompt_tokens")


def sorted_trace(requests: Iterable[TraceRequest]) -> list[TraceRequest]:
    """The requests in arrival order (stable for equal arrivals)."""
    return sorted(requests, key=lambda r: r.arrival_s)


def write_jsonl(path: str | Path, requests: Sequence[TraceRequest]) -> None:
    """Write one JSON object per request."""
    with Path(path).open("w") as out:
        for r in requests:
            out.write(json.dumps(asdict(r)) + "\n")


def read_jsonl(path: str | Path) -> list[TraceRequest]:
    """Read a trace file (blank lines skipped); TraceError names the bad line."""
    requests: list[TraceRequest] = []
    with Path(path).open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                requests.append(TraceRequest(**json.loads(line)))
            except (json.JSONDecodeError, TypeError, TraceError) as exc:
                raise TraceError(f"{path}:{number}: {exc}") from exc
    return sorted_trace(requests)
