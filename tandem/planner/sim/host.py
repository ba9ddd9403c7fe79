"""Workers that share a host's cores slow each other down: the host-sharing model.

A profile times one engine alone. Where a prefill and a decode worker run on the same CPUs
(the local validation's disaggregated setups, ``make serve`` on one machine), each one's
steps run longer while the other computes: on a 2-core VM a one-row decode step took
1.6-2.6x its time alone while the prefill engine computed, an 8-row step 1.6-2.1x (the
factors move from hour to hour there), a 512-token prefill 1.6-2.0x while the decode engine
stepped (docs/bench/host_contention.md). GPUs do not share this way, so the model is off unless a
:class:`HostSharing` is given.

With one, the i-th prefill worker and the i-th decode worker (in start order) share a host:

- a prefill step runs at ``1 / prefill_factor(tokens)`` of its speed while its decode peer
  is busy (has rows or local prefill work), at full speed otherwise; a change of the peer's
  state mid-step stretches or shrinks the rest of the step (the work left is kept). One
  factor for every step, or a table by the step's prompt tokens (measured under serving, it
  depends on the length: bench/step_overlap.prefill_length_table), linear in between, the
  end values beyond;
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
    """A slowdown below 1 (a neighbour cannot make a worker faster), or a table (decode rows,
    prefill tokens) whose keys do not rise."""


DecodeSlowdown = float | tuple[tuple[int, float], ...]
"""One factor for every decode batch, or ``((rows, factor), ...)`` by batch size."""

PrefillSlowdown = float | tuple[tuple[int, float], ...]
"""One factor for every prefill step, or ``((prompt tokens, factor), ...)`` by its tokens."""


def _factors(table: DecodeSlowdown | PrefillSlowdown, what: str) -> list[float]:
    """The factors of a slowdown; raises HostSharingError for a table whose keys do not
    rise from 1 or more."""
    if not isinstance(table, tuple):
        return [table]
    keys = [k for k, _ in table]
    if not table or keys != sorted(set(keys)) or keys[0] < 1:
        raise HostSharingError(f"{what} must rise from >= 1, got {table}")
    return [f for _, f in table]


def _lookup(table: DecodeSlowdown | PrefillSlowdown, x: int) -> float:
    """The factor at ``x``: linear between a table's points, its end values beyond."""
    if not isinstance(table, tuple):
        return table
    i = bisect_right(table, x, key=lambda point: point[0])
    if i == 0:
        return table[0][1]
    if i == len(table):
        return table[-1][1]
    (x0, f0), (x1, f1) = table[i - 1], table[i]
    return f0 + (f1 - f0) * (x - x0) / (x1 - x0)


def _table_text(table: DecodeSlowdown | PrefillSlowdown) -> str:
    return (f"{table:.2f}" if not isinstance(table, tuple)
            else "/".join(f"{k}:{f:.2f}" for k, f in table))


def _parse_table(text: str) -> DecodeSlowdown:
    if ":" in text:
        return tuple((int(k), float(f)) for k, f in (pair.split(":") for pair in text.split("/")))
    return float(text)


@dataclass(frozen=True, slots=True)
class HostSharing:
    """Slowdowns of co-located prefill and decode workers (see the module docstring):
    ``decode_slowdown`` multiplies a decode step while the peer prefill worker computes (one
    factor, or a table of ``(rows, factor)`` with rows rising), ``prefill_slowdown`` a
    prefill step while the peer decode worker steps (one factor, or a table of ``(prompt
    tokens, factor)``)."""

    decode_slowdown: DecodeSlowdown = 1.0
    prefill_slowdown: PrefillSlowdown = 1.0

    def __post_init__(self) -> None:
        factors = (_factors(self.decode_slowdown, "decode rows")
                   + _factors(self.prefill_slowdown, "prefill tokens"))
        if not min(factors) >= 1.0:
            raise HostSharingError(f"slowdowns must be >= 1, got {self}")

    def decode_factor(self, rows: int) -> float:
        """A decode step's factor at ``rows`` rows while the prefill peer computes."""
        return _lookup(self.decode_slowdown, rows)

    def prefill_factor(self, tokens: int) -> float:
        """A prefill step's factor at ``tokens`` prompt tokens while the decode peer steps."""
        return _lookup(self.prefill_slowdown, tokens)

    def decode_scaled(self, k: float) -> HostSharing:
        """The same model with every decode factor times ``k`` (at least 1): how much a
        prediction moves with the factor's measurement error."""
        table = self.decode_slowdown
        decode: DecodeSlowdown = (max(table * k, 1.0) if not isinstance(table, tuple) else
                                  tuple((r, max(f * k, 1.0)) for r, f in table))
        return HostSharing(decode, self.prefill_slowdown)

    @classmethod
    def parse(cls, text: str) -> HostSharing:
        """``"DECODE,PREFILL"``: ``"2.1,1.8"``, or with a factor by batch size (decode) or by
        prompt tokens (prefill), ``"1:2.4/8:1.9/32:1.5,64:1.8/1024:1.3"`` (key:factor pairs
        joined by ``/``)."""
        try:
            decode_text, prefill_text = text.split(",")
            decode, prefill = _parse_table(decode_text), _parse_table(prefill_text)
        except ValueError as exc:
            raise HostSharingError(f"expected DECODE,PREFILL slowdowns, got {text!r}") from exc
        return cls(decode, prefill)

    def flag(self) -> str:
        """The ``--host-sharing`` text :meth:`parse` reads back."""
        return f"{_table_text(self.decode_slowdown)},{_table_text(self.prefill_slowdown)}"


class HostPeer(Protocol):
    """A worker that shares its host: whether it computes, and news of its peer's state."""

    @property
    def stepping(self) -> bool:
        """Whether it is computing a step now."""
        ...

    def peer_busy(self, busy: bool, at_s: float) -> None:
        """Its host peer started (``busy``) or stopped computing at ``at_s``."""
        ...
