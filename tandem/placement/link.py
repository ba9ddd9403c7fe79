"""What a KV push costs on the link between a prefill and a decode worker, learnt per pair.

A remote prefill moves the prompt's KV (``kv_bytes_per_token`` x the tokens the decode worker
lacks) from the prefill worker to the decode worker before the first token is answered; on a
slow link that can cost more than the prefill compute it saves. ``LinkEstimates`` prices a
push for ``cost_model.decide``::

    seconds(P, D, bytes) = latency(P, D) + bytes / bytes_per_s(P, D)

Each pair's two figures are measured from its own pushes: the router observes, for every
remote prefill, the bytes pushed and the seconds the push added after the prefill worker's
first token (the Prefill call's time less the worker's own time to that token: the last
layers on the wire, COMMIT and its ACK, and the reply). Layers ship while later ones compute,
so that is the link's *exposed* cost, which is what the first token waits for; on a link the
compute hides, the measured bytes/s is higher than the line rate. The fit is an exponential
moving least squares of seconds on bytes (slope: seconds per byte, intercept: the fixed
latency; both kept >= 0); while every push had the same size, the prior's latency stands and
the rest is bandwidth.

A pair never measured is priced by ``LinkPrior`` (configured: the link the operator expects);
a measured pair's figure fades back to the prior with ``half_life_s`` since its last push and
is dropped (unknown again) after ``STALE_HALF_LIVES`` half-lives: a link that was slow once is
tried again at the prior's price, and one that got slower is learnt again from new pushes.
Pure: no I/O; the caller passes its clock (``now``).
"""

from __future__ import annotations

from dataclasses import dataclass

# A measured figure is forgotten after this many half-lives without a push (weight 1/16).
STALE_HALF_LIVES = 4.0
LINK_HALF_LIFE_S = 120.0


# Bytes per element of the KV cache's storage dtypes (kv_transfer.layout.ITEMSIZE's).
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1,
                               "float8_e4m3fn": 1}


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str) -> int:
    """KV bytes one token occupies (keys and values of every layer) in a cache of ``dtype``
    (its storage dtype; an unknown one counts 2 bytes), as a push sends them (int8 caches'
    per-vector scales left out: a few percent)."""
    return 2 * num_layers * num_kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True, slots=True)
class LinkPrior:
    """The link assumed for a pair never measured: ``gbps`` gigabits/s and ``rtt_s`` fixed
    seconds per push (a round trip: COMMIT and its ACK)."""

    gbps: float = 10.0
    rtt_s: float = 0.0005

    def __post_init__(self) -> None:
        if not self.gbps > 0 or self.rtt_s < 0:
            raise ValueError(f"a link needs gbps > 0 and rtt >= 0 (got {self.gbps}, {self.rtt_s})")

    @property
    def bytes_per_s(self) -> float:
        """The bandwidth in bytes per second."""
        return self.gbps * 1e9 / 8

    def seconds(self, nbytes: float) -> float:
        """A push of ``nbytes`` on this link."""
        return self.rtt_s + nbytes / self.bytes_per_s


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    """One pair's measured link: ``bytes_per_s`` (inf: the pushes' size did not matter),
    ``latency_s``, pushes seen, and ``trust`` (1 just measured, fading to 0 when stale)."""

    bytes_per_s: float
    latency_s: float
    samples: int
    trust: float

    def seconds(self, nbytes: float) -> float:
        """A push of ``nbytes`` at the measured figures."""
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(slots=True)
class _Fit:
    mx: float  # mean bytes
    my: float  # mean seconds
    vx: float  # variance of bytes
    cxy: float  # covariance of bytes and seconds
    samples: int
    seen: float | None  # ``now`` of the last push


class LinkEstimates:
    """Per (prefill endpoint, decode endpoint) pair: the measured link, or the prior."""

    def __init__(self, prior: LinkPrior | None = None, weight: float = 0.2,
                 half_life_s: float = LINK_HALF_LIFE_S) -> None:
        if not 0 < weight <= 1 or not half_life_s > 0:
            raise ValueError("weight must be in (0, 1] and half_life_s > 0")
        self.prior = prior if prior is not None else LinkPrior()
        self._weight = weight
        self._half_life_s = half_life_s
        self._fits: dict[tuple[str, str], _Fit] = {}

    def observe(self, src: str, dst: str, nbytes: int, seconds: float,
                now: float | None = None) -> None:
        """Fold in one push of ``nbytes`` from ``src`` to ``dst`` that took ``seconds``
        (exposed; a negative figure, clock noise, counts as 0) ending at ``now``."""
        if nbytes <= 0:
            return
        x, y = float(nbytes), max(seconds, 0.0)
        fit = self._fits.get((src, dst))
        if fit is None or self._trust(fit, now) <= 0.0:
            self._fits[(src, dst)] = _Fit(x, y, 0.0, 0.0, 1, now)
            return
        w = self._weight
        dx, dy = x - fit.mx, y - fit.my
        fit.mx += w * dx
        fit.my += w * dy
        # West's weighted update: (co)variances about the moving means.
        fit.vx = (1 - w) * (fit.vx + w * dx * dx)
        fit.cxy = (1 - w) * (fit.cxy + w * dx * dy)
        fit.samples += 1
        if now is not None:
            fit.seen = now

    def _trust(self, fit: _Fit, now: float | None) -> float:
        if now is None or fit.seen is None or now <= fit.seen:
            return 1.0
        halves = (now - fit.seen) / self._half_life_s
        return 0.0 if halves >= STALE_HALF_LIVES else 0.5 ** halves

    def estimate(self, src: str, dst: str, now: float | None = None) -> LinkEstimate | None:
        """The pair's measured link at ``now``; None when never measured or stale."""
        fit = self._fits.get((src, dst))
        if fit is None:
            return None
        trust = self._trust(fit, now)
        if trust <= 0.0:
            del self._fits[(src, dst)]
            return None
        # Relative spread: a constant push size (vx ~ 0 up to rounding) gives no slope.
        if fit.vx > (1e-3 * fit.mx) ** 2:
            per_byte = max(fit.cxy / fit.vx, 0.0)
            latency = fit.my - per_byte * fit.mx
            if latency < 0.0:  # the slope overshoots at small pushes: a line through 0
                latency, per_byte = 0.0, fit.my / fit.mx
        else:
            latency = min(self.prior.rtt_s, fit.my)
            per_byte = (fit.my - latency) / fit.mx
        rate = 1.0 / per_byte if per_byte > 0 else float("inf")
        return LinkEstimate(rate, latency, fit.samples, trust)

    def seconds(self, src: str, dst: str, nbytes: int, now: float | None = None) -> float:
        """What a push of ``nbytes`` from ``src`` to ``dst`` costs: the measured figure,
        faded towards the prior's as it ages (the prior's alone when unknown)."""
        prior = self.prior.seconds(nbytes)
        est = self.estimate(src, dst, now)
        if est is None:
            return prior
        return est.trust * est.seconds(nbytes) + (1.0 - est.trust) * prior

    def pairs(self) -> list[tuple[str, str]]:
        """The pairs with a measured figure (stale ones included until next read)."""
        return list(self._fits)

    def forget(self, endpoint: str) -> None:
        """A worker that left the pool: every pair it is one end of."""
        for pair in [p for p in self._fits if endpoint in p]:
            del self._fits[pair]
