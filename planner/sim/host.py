"""Workers that share a host's cores slow each other down: the host-sharing model.

A profile times one engine alone. Where a prefill and a decode worker run on the same CPUs
(the local validation's disaggregated setups, ``make serve`` on one machine), each one's
steps run longer while the other computes: on a 2-core VM a one-row decode step took
1.6-2.6x its time alone while the prefill engine computed, an 8-row step 1.6-2.1x (the
factors move from hour to hour there), a 512-token prefill 1.6-2.0x while the decode engine
stepped (docs/planner.md). GPUs do not share this way, so the model is off unless a
:class:`HostSharing` is given.

With one, the i-th prefill worker and the i-th decode worker (in start order) share a host:

- a prefill step runs at ``1 / prefill_slowdown`` of its speed while its decode peer is
  busy (has rows or local prefill work), at full speed otherwise; a change of the peer's
  state mid-step stretches or shrinks the rest of the step (the work left is kept);
- a decode step lasts ``decode_factor(rows)`` times its profile length while its prefill
  peer computes a step: one factor for every batch, or a table by rows (measured at a few
  batch sizes, linear in between, the end values beyond). A change reaches the decode worker
  at its next step boundary (its macro steps are cut there, as a row's arrival cuts them):
  the step in flight keeps the factor it started with.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Protocol


class HostSharingError(ValueError):
    """A slowdown below 1 (a neighbour cannot make a worker faster), or a decode table whose
    rows do not rise."""


DecodeSlowdown = float | tuple[tuple[int, float], ...]
"""One factor for every decode batch, or ``((rows, factor), ...)`` by batch size."""


@dataclass(frozen=True, slots=True)
class HostSharing:
    """Slowdowns of co-located prefill and decode workers (see the module docstring):
    ``decode_slowdown`` multiplies a decode step while the peer prefill worker computes (one
    factor, or a table of ``(rows, factor)`` with rows rising), ``prefill_slowdown`` a
    prefill step while the peer decode worker steps."""

    decode_slowdown: DecodeSlowdown = 1.0
    prefill_slowdown: float = 1.0

    def __post_init__(self) -> None:
        table = self.decode_slowdown
        if isinstance(table, tuple):
            rows = [r for r, _ in table]
            if not table or rows != sorted(set(rows)) or rows[0] < 1:
                raise HostSharingError(f"decode rows must rise from >= 1, got {table}")
            factors = [f for _, f in table]
        else:
            factors = [table]
        if not (min(factors) >= 1.0 and self.prefill_slowdown >= 1.0):
            raise HostSharingError(f"slowdowns must be >= 1, got {self}")

    def decode_factor(self, rows: int) -> float:
        """A decode step's factor at ``rows`` rows while the prefill peer computes."""
        table = self.decode_slowdown
        if not isinstance(table, tuple):
            return table
        i = bisect_right(table, rows, key=lambda point: point[0])
        if i == 0:
            return table[0][1]
        if i == len(table):
            return table[-1][1]
        (r0, f0), (r1, f1) = table[i - 1], table[i]
        return f0 + (f1 - f0) * (rows - r0) / (r1 - r0)

    def decode_scaled(self, k: float) -> HostSharing:
        """The same model with every decode factor times ``k`` (at least 1): how much a
        prediction moves with the factor's measurement error."""
        table = self.decode_slowdown
        decode: DecodeSlowdown = (max(table * k, 1.0) if not isinstance(table, tuple) else
                                  tuple((r, max(f * k, 1.0)) for r, f in table))
        return HostSharing(decode, self.prefill_slowdown)

    @classmethod
    def parse(cls, text: str) -> HostSharing:
        """``"DECODE,PREFILL"``: ``"2.1,1.8"``, or with the decode factor by batch size,
        ``"1:2.4/8:1.9/32:1.5,1.8"`` (rows:factor pairs joined by ``/``)."""
        try:
            decode_text, prefill_text = text.split(",")
            decode: DecodeSlowdown
            if ":" in decode_text:
                decode = tuple((int(r), float(f)) for r, f in
                               (pair.split(":") for pair in decode_text.split("/")))
            else:
                decode = float(decode_text)
            prefill = float(prefill_text)
        except ValueError as exc:
            raise HostSharingError(f"expected DECODE,PREFILL slowdowns, got {text!r}") from exc
        return cls(decode, prefill)

    def flag(self) -> str:
        """The ``--host-sharing`` text :meth:`parse` reads back."""
        table = self.decode_slowdown
        decode = (f"{table:.2f}" if not isinstance(table, tuple)
                  else "/".join(f"{r}:{f:.2f}" for r, f in table))
        return f"{decode},{self.prefill_slowdown:.2f}"


class HostPeer(Protocol):
    """A worker that shares its host: whether it computes, and news of its peer's state."""

    @property
    def stepping(self) -> bool:
        """Whether it is computing a step now."""
        ...

    def peer_busy(self, busy: bool, at_s: float) -> None:
        """Its host peer started (``busy``) or stopped computing at ``at_s``."""
        ...
