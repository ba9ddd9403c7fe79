"""Membership's worker messages -> the registry's plain types.

    WorkerStats (a Stats probe's reply, a Heartbeat's load)  -> WorkerLoad
    Role (a Register)                                        -> placement's Role
"""

from __future__ import annotations

import math

from tandem.common import block_hash
from tandem.placement.worker_view import Role
from tandem.protos.v1 import worker_pb2
from tandem.router.membership.registry import WorkerLoad

_ROLES = {worker_pb2.ROLE_PREFILL: Role.PREFILL, worker_pb2.ROLE_DECODE: Role.DECODE}
ROLE_PROTOS = {role: proto for proto, role in _ROLES.items()}  # Role -> its wire value
_WEIGHTS_FORMAT_CHARS = 200  # a worker's report, not trusted to be short
_MAX_LORAS = 1024  # adapters taken from one report; each identity at most _LORA_CHARS
_LORA_CHARS = 160


def stats_request() -> worker_pb2.StatsRequest:
    """A Stats call's (empty) request."""
    return worker_pb2.StatsRequest()


def role_from_proto(role: int) -> Role | None:
    """A registering worker's role (None: unspecified or unknown)."""
    return _ROLES.get(role)  # type: ignore[call-overload]


def load_of(stats: worker_pb2.WorkerStats) -> WorkerLoad:
    """The policy-relevant part of a WorkerStats message."""
    return WorkerLoad(
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_free_blocks=stats.num_free_blocks,
        num_blocks=stats.num_blocks,
        draining=stats.draining,
        step_base_s=_optional(stats, "step_base_s"),
        step_per_row_s=_optional(stats, "step_per_row_s"),
        step_per_prefill_token_s=_optional(stats, "step_per_prefill_token_s"),
        queued_prefill_tokens=stats.pending_prefill_tokens,
        max_batched_tokens=stats.max_batched_tokens,
        cached_blocks=block_hash.unpack(stats.cached_block_hashes),
        weights_format=stats.weights_format[:_WEIGHTS_FORMAT_CHARS],
        loras=frozenset(identity for name, identity in list(stats.loras.items())[:_MAX_LORAS]
                        if len(identity) <= _LORA_CHARS and identity.startswith(name + "@")),
    )


def _optional(stats: worker_pb2.WorkerStats, name: str) -> float | None:
    """An optional cost figure; None when the worker has not measured it (or sent nonsense)."""
    if not stats.HasField(name):  # type: ignore[arg-type]
        return None
    value = float(getattr(stats, name))
    return value if math.isfinite(value) and value >= 0 else None
