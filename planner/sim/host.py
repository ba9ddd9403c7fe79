"""Workers that share a host's cores slow each other down: the host-sharing model.

A profile times one engine alone. Where a prefill and a decode worker run on the same CPUs
(the local validation's disaggregated setups, ``make serve`` on one machine), each one's
steps run longer while the other computes: on a 2-core VM a decode step took 2.0-2.6x its
time alone while the prefill engine computed, a 512-token prefill 1.6-2.0x while the decode
engine stepped (docs/planner.md). GPUs do not share this way, so the model is off unless a
:class:`HostSharing` is given.

With one, the i-th prefill worker and the i-th decode worker (in start order) share a host:

- a prefill step runs at ``1 / prefill_slowdown`` of its speed while its decode peer is
  busy (has rows or local prefill work), at full speed otherwise; a change of the peer's
  state mid-step stretches or shrinks the rest of the step (the work left is kept);
- a decode step lasts ``decode_slowdown`` times its profile length while its prefill peer
  computes a step. A change reaches the decode worker at its next step boundary (its
  macro steps are cut there, as a row's arrival cuts them): the step in flight keeps the
  factor it started with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class HostSharingError(ValueError):
    """A slowdown below 1 (a neighbour cannot make a worker faster)."""


@dataclass(frozen=True, slots=True)
class HostSharing:
    """Slowdowns of co-located prefill and decode workers (see the module docstring):
    ``decode_slowdown`` multiplies a decode step while the peer prefill worker computes,
    ``prefill_slowdown`` a prefill step while the peer decode worker steps."""

    decode_slowdown: float = 1.0
    prefill_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not (self.decode_slowdown >= 1.0 and self.prefill_slowdown >= 1.0):
            raise HostSharingError(f"slowdowns must be >= 1, got {self}")

    @classmethod
    def parse(cls, text: str) -> HostSharing:
        """``"DECODE,PREFILL"`` (e.g. ``"2.1,1.8"``) as a HostSharing."""
        try:
            decode, prefill = (float(x) for x in text.split(","))
        except ValueError as exc:
            raise HostSharingError(f"expected DECODE,PREFILL slowdowns, got {text!r}") from exc
        return cls(decode, prefill)


class HostPeer(Protocol):
    """A worker that shares its host: whether it computes, and news of its peer's state."""

    @property
    def stepping(self) -> bool:
        """Whether it is computing a step now."""
        ...

    def peer_busy(self, busy: bool, at_s: float) -> None:
        """Its host peer started (``busy``) or stopped computing at ``at_s``."""
        ...
