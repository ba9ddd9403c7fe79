"""Shared factories for the simulator tests (tandem/planner/sim/): profiles, requests, checks."""

from __future__ import annotations

from tandem.planner.profile import Profile, StepCost, Transfer
from tandem.planner.sim import SimResult
from tandem.planner.trace import TraceRequest

BASE, PER_ROW, PER_TOKEN = 0.01, 0.001, 0.0001


def profile(per_ctx: float = 0.0, *, per_token: float = PER_TOKEN, bandwidth: float = 1e9,
            latency: float = 0.0, kv_bytes: int = 1000, capacity: int = 100_000,
            chunk: int = 512, seqs: int = 16, per_pair: float | None = None) -> Profile:
    """A worker with round step costs: 10 ms a step, 1 ms a row, 0.1 ms a prompt token;
    ``per_ctx`` a decode row's cost per context token, ``per_pair`` a prefill query-key
    pair's (default: ``per_ctx``)."""
    pair = per_ctx if per_pair is None else per_pair
    return Profile("m", "test", StepCost(BASE, PER_ROW, per_token, per_ctx, pair),
                   Transfer(bandwidth, latency), kv_bytes_per_token=kv_bytes,
                   kv_capacity_tokens=capacity, chunk_tokens=chunk, max_num_seqs=seqs,
                   block_size=16)


def req(arrival: float, prompt: int, output: int, group: int = -1, prefix: int = 0,
        conversation: int = -1) -> TraceRequest:
    """One trace request."""
    return TraceRequest(arrival, prompt, output, prefix_group=group, prefix_tokens=prefix,
                        conversation=conversation)


def assert_clean(result: SimResult) -> None:
    """Every block reserved came back; nothing was left waiting or lost."""
    assert result.leaked_blocks == 0
    assert result.stranded == 0
    assert all(o.completed or o.failed for o in result.outcomes)
