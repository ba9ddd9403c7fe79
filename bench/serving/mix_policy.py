"""Which role a local cluster's spare worker is to serve, read from the router's token mix: the
explicit flip policy of bench/serving/flip_mixshift.py (``tandem local`` runs no autoscaler).

    every scrape: (t, prompt tokens, output tokens), the router's cumulative counters
                  (tandem_prompt_tokens_total: admitted prompts; tandem_generation_tokens_total:
                  tokens streamed)
    share   = prompt tokens / all tokens over the last ``window_s``
              (None until the scrapes span ``window_s`` and it holds ``min_tokens`` tokens)
    share >= high  -> prefill      share <= low -> decode      between: as it is
    no flip sooner than ``dwell_s`` after the last one (a flip moves streams or waits for
    queued prompts: undoing it at once costs two)

A chat turn (short prompt, longer answer) has a share near 0.4, a RAG request (long context,
short answer) near 0.97, so the band between ``low`` and ``high`` keeps a mixed window from
flipping back and forth. The router counts a prompt's tokens once the request passes its
admission gate (tandem/router/frontend.py): under a backlog the share follows what the router
hands out, not what arrives, and a flip back waits for the backlog (docs/bench/flip_mixshift.md).
Pure: counters in, a role out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class MixSettings:
    """The policy's thresholds (the module docstring)."""

    window_s: float = 6.0
    high: float = 0.8
    low: float = 0.6
    min_tokens: int = 300
    dwell_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"need 0 <= low < high <= 1 (low {self.low}, high {self.high})")
        if self.window_s <= 0 or self.dwell_s < 0 or self.min_tokens < 1:
            raise ValueError("window_s > 0, dwell_s >= 0 and min_tokens >= 1")


class MixDetector:
    """The prompt tokens' share of all tokens over the last ``window_s`` of scrapes."""

    def __init__(self, settings: MixSettings) -> None:
        self.settings = settings
        self._points: deque[tuple[float, float, float]] = deque()

    def observe(self, t: float, prompt_total: float, output_total: float) -> None:
        """One scrape at ``t`` (seconds, any monotonic clock) of the cumulative counters."""
        self._points.append((t, prompt_total, output_total))
        while len(self._points) > 1 and t - self._points[1][0] >= self.settings.window_s:
            self._points.popleft()  # keep one point at or before the window's start

    def share(self) -> float | None:
        """Prompt tokens over all tokens in the window (None: it spans less than
        ``window_s`` or holds fewer than ``min_tokens``)."""
        if len(self._points) < 2:
            return None
        (t0, p0, o0), (t1, p1, o1) = self._points[0], self._points[-1]
        prompt, output = p1 - p0, o1 - o0
        if t1 - t0 < self.settings.window_s or prompt + output < self.settings.min_tokens:
            return None
        return prompt / (prompt + output)


class MixPolicy:
    """The spare worker's role: flip it to prefill when the mix turns prompt-heavy, back to
    decode when it turns output-heavy (the module docstring)."""

    def __init__(self, settings: MixSettings, serving: str = "decode") -> None:
        if serving not in ROLES:
            raise ValueError(f"no role {serving!r}")
        self.settings = settings
        self.detector = MixDetector(settings)
        self.serving = serving
        self._last_flip = -math.inf

    def observe(self, t: float, prompt_total: float, output_total: float) -> str | None:
        """Add a scrape; the role to flip the spare worker to now (None: keep it)."""
        self.detector.observe(t, prompt_total, output_total)
        share = self.detector.share()
        if share is None or t - self._last_flip < self.settings.dwell_s:
            return None
        want = ("prefill" if share >= self.settings.high
                else "decode" if share <= self.settings.low else self.serving)
        return want if want != self.serving else None

    def refused(self, t: float) -> None:
        """A flip asked for did not happen (the router said why): the next waits ``dwell_s``
        too, instead of being asked again at every scrape."""
        self._last_flip = t

    def flipped(self, t: float, role: str) -> None:
        """The spare worker serves ``role`` from ``t`` on (a flip the router made)."""
        if role not in ROLES:
            raise ValueError(f"no role {role!r}")
        self.serving = role
        self._last_flip = t
