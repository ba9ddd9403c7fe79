"""Membership's worker messages: a WorkerStats becomes the registry's WorkerLoad (cost figures
only when measured and sane, a report's text bounded), a Register's role placement's Role."""

from __future__ import annotations

import math

from tandem.common import block_hash
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2
from tandem.router.convert.membership import load_of, role_from_proto


def test_roles() -> None:
    assert role_from_proto(worker_pb2.ROLE_PREFILL) is Role.PREFILL
    assert role_from_proto(worker_pb2.ROLE_DECODE) is Role.DECODE
    assert role_from_proto(worker_pb2.ROLE_UNSPECIFIED) is None
    assert role_from_proto(99) is None


def test_load_of_stats() -> None:
    hashes = [3, 1, 2]
    load = load_of(worker_pb2.WorkerStats(
        num_running=1, num_waiting=2, num_free_blocks=3, num_blocks=4, draining=True,
        step_base_s=0.01, step_per_row_s=math.nan, pending_prefill_tokens=5,
        max_batched_tokens=6, cached_block_hashes=block_hash.pack(hashes),
        weights_format="x" * 300))
    assert (load.num_running, load.num_waiting, load.num_free_blocks, load.num_blocks) == (
        1, 2, 3, 4)
    assert load.draining and (load.queued_prefill_tokens, load.max_batched_tokens) == (5, 6)
    assert load.step_base_s is not None and math.isclose(load.step_base_s, 0.01)
    assert load.step_per_row_s is None  # sent, but nonsense
    assert load.step_per_prefill_token_s is None  # never measured
    assert load.cached_blocks == frozenset(hashes)
    assert load.weights_format == "x" * 200
