"""What every handoff shares (``HandoffDeps``), and the refusal a client gets when every
decode worker is full for now."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.placement.affinity import PrefixAffinity
from tandem.placement.link import LinkEstimates
from tandem.placement.log import PlacementLog
from tandem.placement.overheads import PrefillOverheads
from tandem.router.config import RouterConfig
from tandem.router.errors import Busy, OverloadedError
from tandem.router.handoff.counters import HandoffCounters
from tandem.router.handoff.held_blocks import HeldBlocks
from tandem.router.handoff.inflight import InflightCalls
from tandem.router.handoff.live_moves import LiveStreams
from tandem.router.membership.registry import Registry
from tandem.router.membership.worker_clients import WorkerClients

GRAMMAR_COMPILING = ("the request's structured-output grammar is still compiling; retry "
                     "after the advised delay")


def refused_for_now(refusals: list[tuple[int, Busy | None]]) -> OverloadedError:
    """What the client is told when every decode worker refused the request for now
    (RESOURCE_EXHAUSTED: ``(retry hint ms, reason)`` each): come back when the soonest
    expects to take it; when a worker's reason was the request's own grammar still
    compiling, that is the reason given (the wait is for the compile, not for room)."""
    hint = min(ms for ms, _ in refusals)
    if any(busy is Busy.GRAMMAR for _, busy in refusals):
        return OverloadedError(GRAMMAR_COMPILING, hint, Busy.GRAMMAR)
    return OverloadedError("every decode worker is full", hint)


@dataclass(frozen=True, slots=True)
class HandoffDeps:
    """What every handoff shares: the pool, the channels, the affinity map, the counters,
    the worker calls in flight (which the health monitor cuts: tandem/router/server.py), the remote
    overheads placement learns, the prefix blocks each worker is believed to hold, and the
    decode streams in flight (which an operator's drain moves live)."""

    config: RouterConfig
    registry: Registry
    clients: WorkerClients
    affinity: PrefixAffinity
    counters: HandoffCounters
    inflight: InflightCalls = field(default_factory=InflightCalls)
    overheads: PrefillOverheads = field(default_factory=PrefillOverheads)
    links: LinkEstimates = field(default_factory=LinkEstimates)  # per P->D pair (link.py)
    held: HeldBlocks = field(default_factory=lambda: HeldBlocks(time.monotonic, 6.0))
    placement_log: PlacementLog | None = None  # --placement-log
    live: LiveStreams = field(default_factory=LiveStreams)  # decode streams a drain may move
