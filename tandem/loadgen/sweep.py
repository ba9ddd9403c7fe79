"""Rate sweeps: SLO attainment at each offered rate, and the highest rate that keeps 90%.

DistServe's goodput is not a throughput but a capacity: the highest request rate at which a
target share (90%) of requests meets both the TTFT and the TPOT target. A sweep runs the same
workload at rising rates on one running setup; ``max_rate`` reads the capacity off the
attainment curve:

    attainment
      1.0 |  *----*
      0.9 |- - - - -\\- - - - -   target
          |          *
      0.5 |           \\
          |            *
          +--+----+---+----+-- rate
            0.2  0.4 ^ 0.6  0.8
                      interpolated crossing (highest passing rate: 0.4)

Each point gets its own seed, so no point's prompts are in the prefix cache from an earlier
one; the same point gets the same seed in every setup, so setups see the same requests. The
multiturn mix's system prompts are the exception: one set for the whole sweep (``system_seed``),
shared across points as a deployment's conversations share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.loadgen.load import Progress, run_conversations, run_load
from tandem.loadgen.multiturn import KIND as MULTITURN
from tandem.loadgen.multiturn import make_conversations
from tandem.loadgen.stats import RequestResult
from tandem.loadgen.workload import MIXES, make_requests

SWEEP_MIXES = (*sorted(MIXES), MULTITURN)
TARGET = 0.9  # DistServe's attainment bar


@dataclass(frozen=True, slots=True)
class Point:
    """One load of a sweep: a mix at an offered rate (requests/s), with its own seed."""

    mix: str
    rate: float
    seed: int

    @property
    def label(self) -> str:
        """``mixed 0.4/s``: how progress lines and record keys name the point."""
        return f"{self.mix} {self.rate:g}/s"


def parse_rates(text: str) -> list[float]:
    """``"0.2,0.4,0.6"`` -> [0.2, 0.4, 0.6], ascending; ValueError for none or any <= 0."""
    rates = sorted(float(x) for x in text.split(",") if x.strip())
    if not rates or rates[0] <= 0:
        raise ValueError(f"rates must be a comma list of positive numbers, got {text!r}")
    return rates


def parse_mixes(text: str) -> list[str]:
    """``"mixed,multiturn"`` -> names, checked against ``SWEEP_MIXES``."""
    mixes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in mixes if m not in SWEEP_MIXES]
    if not mixes or unknown:
        raise ValueError(f"unknown mix {unknown or text!r}; choose from {', '.join(SWEEP_MIXES)}")
    return mixes


def sweep_points(mixes: Sequence[str], rates: Sequence[float], seed: int) -> list[Point]:
    """Every (mix, rate), mix by mix, rates ascending; seeds distinct per point."""
    ordered = sorted(rates)
    return [
        Point(mix, rate, seed + 1000 + i * len(ordered) + j)
        for i, mix in enumerate(mixes)
        for j, rate in enumerate(ordered)
    ]


async def run_point(
    target: str,
    point: Point,
    num_requests: int,
    *,
    vocab: tuple[int, int],
    scale: float = 1.0,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    system_seed: int | None = None,
) -> tuple[list[RequestResult], float]:
    """One point's load on a router: ``num_requests`` requests (multiturn: turns in all;
    ``system_seed``: its system prompts, see ``make_conversations``)."""
    if point.mix == MULTITURN:
        conversations = make_conversations(point.rate, num_requests, seed=point.seed,
                                           vocab=vocab, scale=scale, system_seed=system_seed)
        return await run_conversations(target, conversations, timeout_s=timeout_s,
                                       progress=progress)
    specs = make_requests(MIXES[point.mix], point.rate, num_requests, seed=point.seed,
                          vocab=vocab, scale=scale)
    return await run_load(target, specs, timeout_s=timeout_s, progress=progress)


@dataclass(frozen=True, slots=True)
class MaxRate:
    """The capacity read off one attainment curve.

    ``rate``: the highest swept rate whose attainment reached the target (0.0: none did).
    ``interpolated``: where the straight line between that point and the next swept rate
    crosses the target; None when no swept rate above it missed (the capacity is then at
    least ``rate``) or none passed.
    """

    rate: float
    interpolated: float | None
    all_miss: bool

    @property
    def estimate(self) -> float:
        """The interpolated crossing where there is one, else the highest passing rate."""
        return self.interpolated if self.interpolated is not None else self.rate

    def to_json(self) -> dict[str, object]:
        """JSON-ready fields."""
        return {"rate": self.rate, "interpolated": self.interpolated, "all_miss": self.all_miss}


def max_rate(curve: Sequence[tuple[float, float]], target: float = TARGET) -> MaxRate:
    """Capacity of ``curve`` ((rate, attainment) pairs, any order) at ``target`` attainment."""
    points = sorted(curve)
    passing = [i for i, (_, a) in enumerate(points) if a >= target]
    if not passing:
        return MaxRate(0.0, None, all_miss=True)
    i = passing[-1]
    rate, above = points[i]
    if i + 1 == len(points):
        return MaxRate(rate, None, all_miss=False)
    next_rate, below = points[i + 1]  # below < target <= above
    crossing = rate + (above - target) / (above - below) * (next_rate - rate)
    return MaxRate(rate, crossing, all_miss=False)
