"""Which rank of a prefill group sends which KV heads to which rank of a decode group.

A tensor-parallel group's cache is one ``[layers, planes, blocks, block_size, heads, row]``
tensor per rank, each holding the rank's own KV heads at the same block ids
(tandem/engine/parallel/plan.py: heads split evenly, or, with fewer KV heads than ranks, each
head replicated on consecutive ranks). Moving a prompt from a group of size a to one of size
b is a set of head slices, each from one prefill rank to one decode rank, computed here from
the two groups' head ranges alone (pure arithmetic, no torch):

    prefill TP=1 [0,3)           ->  decode TP=3 [0,1) [1,2) [2,3)
        routes: 0->0 heads [0,1), 0->1 heads [1,2), 0->2 heads [2,3)
    prefill TP=3 [0,1) [1,2) [2,3) -> decode TP=1 [0,3)
        routes: 0->0 [0,1), 1->0 [1,2), 2->0 [2,3)
    prefill TP=4 over 2 heads [0,1) [0,1) [1,2) [1,2) -> decode TP=1 [0,2)
        routes: 0->0 [0,1), 2->0 [1,2)           (a replicated head is sent once)
    prefill TP=1 [0,1) -> decode TP=2 over 1 head [0,1) [0,1)
        routes: 0->0 [0,1); copies: 0->1 [0,1)   (the decode group fills its replica itself)

Every KV head crosses the wire exactly once (from the lowest prefill rank holding it to the
lowest decode rank holding it), so a re-sharded push moves the same bytes as a single-rank
handoff of the same prompt; a decode rank that holds a replica takes it from its group's
primary (``copies``). Two groups whose layouts differ in anything but how the heads are
split (model, dtypes, block size, layers, head size, the number of KV heads) cannot be
re-sharded: ``check_reshardable`` raises ``ReshardError``, a ``LayoutMismatchError``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.kv_transfer.errors import LayoutMismatchError, MalformedFrame
from tandem.kv_transfer.layout import KvLayout

MAX_GROUP = 1024  # ranks a stated group may have (a hostile HELLO cannot make us loop longer)


class ReshardError(LayoutMismatchError):
    """Two groups' KV layouts differ in more than the split of their heads (the message names
    the fields), or a group's head ranges do not describe a cache."""


@dataclass(frozen=True, slots=True)
class GroupKv:
    """A group's KV cache as its rank 0 states it: one rank's layout (``num_kv_heads``: that
    rank's own heads) and every rank's half-open KV head range ``[start, stop)``, by rank."""

    layout: KvLayout
    head_ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        n = len(self.head_ranges)
        if not 1 <= n <= MAX_GROUP:
            raise ReshardError(f"a group of {n} ranks (1..{MAX_GROUP})")
        if n != max(1, self.layout.tensor_parallel_size):
            raise ReshardError(f"{n} head ranges for a layout of tensor_parallel_size "
                               f"{self.layout.tensor_parallel_size}")
        sizes = {stop - start for start, stop in self.head_ranges}
        if len(sizes) != 1 or self.head_ranges[0][1] - self.head_ranges[0][0] != \
                self.layout.num_kv_heads:
            raise ReshardError(f"every rank of a group holds {self.layout.num_kv_heads} KV heads"
                               f" (its layout's), not {sorted(sizes)}")
        held = {h for start, stop in self.head_ranges for h in range(start, stop)}
        if any(start < 0 for start, _ in self.head_ranges) or held != set(range(len(held))):
            raise ReshardError(f"head ranges {list(self.head_ranges)} do not cover heads 0..k "
                               "with no gap")

    @classmethod
    def single(cls, layout: KvLayout) -> GroupKv:
        """A one-process cache: every KV head on rank 0."""
        return cls(layout, ((0, layout.num_kv_heads),))

    @property
    def world(self) -> int:
        """Ranks in the group."""
        return len(self.head_ranges)

    @property
    def total_kv_heads(self) -> int:
        """The model's KV heads (each rank holds a range of them)."""
        return max(stop for _, stop in self.head_ranges)

    def primary(self, head: int) -> int:
        """The lowest rank holding ``head``: the one that sends it, or receives it."""
        return next(r for r, (start, stop) in enumerate(self.head_ranges) if start <= head < stop)

    def whole(self) -> KvLayout:
        """The layout of the same cache held by one process (every head): what two groups must
        agree on to be re-sharded."""
        return replace(self.layout, num_kv_heads=self.total_kv_heads, tensor_parallel_size=0)

    def to_wire(self) -> dict[str, object]:
        """The group as a msgpack-ready map (sent at HELLO beside the layout)."""
        return {"layout": self.layout.to_wire(), "head_ranges": [list(r) for r in self.head_ranges]}

    @classmethod
    def from_wire(cls, data: object) -> GroupKv:
        """Parse a peer's group map, refusing anything not exactly typed (MalformedFrame) or
        not a cache (ReshardError)."""
        if not isinstance(data, dict):
            raise MalformedFrame("group is not a map")
        ranges = data.get("head_ranges")
        if not isinstance(ranges, list) or not 1 <= len(ranges) <= MAX_GROUP or not all(
                isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r)
                for r in ranges):
            raise MalformedFrame(f"group.head_ranges is not a list of 1..{MAX_GROUP} int pairs")
        return cls(KvLayout.from_wire(data.get("layout")),
                   tuple((int(a), int(b)) for a, b in ranges))


@dataclass(frozen=True, slots=True)
class Route:
    """Heads ``[start, stop)`` (the model's numbering) from prefill rank ``src`` to decode rank
    ``dst``; ``src_offset``/``dst_offset``: where the first of them sits in each rank's cache."""

    src: int
    dst: int
    start: int
    stop: int
    src_offset: int
    dst_offset: int

    @property
    def heads(self) -> int:
        """How many heads the route carries."""
        return self.stop - self.start


def check_reshardable(src: GroupKv, dst: GroupKv) -> None:
    """Raise ``ReshardError`` naming the fields unless the two groups hold the same cache split
    differently (then ``routes`` moves it)."""
    a, b = src.whole(), dst.whole()
    if a.fingerprint != b.fingerprint:
        raise ReshardError("KV layouts differ beyond the split of their heads: "
                           + "; ".join(a.diff(b)))


def routes(src: GroupKv, dst: GroupKv) -> list[Route]:
    """Every head once, from its prefill primary to its decode primary, consecutive heads
    with the same pair merged; sorted by (src, dst, start). Checks ``check_reshardable``."""
    check_reshardable(src, dst)
    out: list[Route] = []
    for h in range(src.total_kv_heads):
        s, d = src.primary(h), dst.primary(h)
        last = out[-1] if out else None
        if last is not None and (last.src, last.dst, last.stop) == (s, d, h):
            out[-1] = replace(last, stop=h + 1)
        else:
            out.append(Route(s, d, h, h + 1, h - src.head_ranges[s][0],
                             h - dst.head_ranges[d][0]))
    return sorted(out, key=lambda r: (r.src, r.dst, r.start))


def copies(dst: GroupKv) -> list[Route]:
    """The replicas a decode group fills itself after a push: heads a rank holds whose
    primary is another rank (``src``: that primary, ``dst``: the replica's rank)."""
    out: list[Route] = []
    for r, (start, stop) in enumerate(dst.head_ranges):
        for h in range(start, stop):
            p = dst.primary(h)
            if p != r:
                out.append(Route(p, r, h, h + 1, h - dst.head_ranges[p][0], h - start))
    return out


def pushed_heads(src: GroupKv, dst: GroupKv) -> int:
    """KV heads that cross the wire for each (layer, plane, block): always the model's."""
    return sum(r.heads for r in routes(src, dst))
