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
        routes: 0->0 [0,1), 0->1 [0,1)           (each decode replica receives its copy)

Each KV head is sent by one prefill rank (the lowest holding it) to every decode rank holding
it: once when the decode group splits its heads, so a re-sharded push moves the same bytes as
a single-rank handoff of the same prompt, and once per replica when the decode group
replicates them (its ranks share no memory to copy a replica through). Of the routes into one
decode rank, the one from the lowest prefill rank commits it (``committer``); the others
finish their frames and leave the COMMIT to it (``parts_into``: BEGIN's ``parts``). Two groups whose layouts differ in anything but how the heads are
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


@dataclass(frozen=True, slots=True)
class RouteHello:
    """What a route's connection states at HELLO: the sending group and the heads it carries
    (the model's numbering). The connection's layout is then the route's: those heads."""

    group: GroupKv
    start: int
    stop: int

    def to_wire(self) -> dict[str, object]:
        """The statement as a msgpack-ready map (HELLO's ``route``)."""
        return {"group": self.group.to_wire(), "heads": [self.start, self.stop]}

    @classmethod
    def from_wire(cls, data: object) -> RouteHello:
        """Parse a peer's statement (MalformedFrame / ReshardError on anything else)."""
        if not isinstance(data, dict):
            raise MalformedFrame("HELLO.route is not a map")
        heads = data.get("heads")
        if not (isinstance(heads, list) and len(heads) == 2
                and all(type(h) is int for h in heads) and 0 <= heads[0] < heads[1]):
            raise MalformedFrame("HELLO.route.heads is not [start, stop]")
        return cls(GroupKv.from_wire(data.get("group")), heads[0], heads[1])


def route_layout(group: GroupKv, rank: int, start: int, stop: int) -> KvLayout:
    """The layout a route's two ends state: rank ``rank``'s cache restricted to heads
    ``[start, stop)`` (the model's numbering), as one process's (ReshardError when the rank
    does not hold them)."""
    lo, hi = group.head_ranges[rank]
    if not lo <= start < stop <= hi:
        raise ReshardError(f"heads [{start}, {stop}) are not held by rank {rank} "
                           f"(heads [{lo}, {hi}))")
    return replace(group.layout, num_kv_heads=stop - start, tensor_parallel_size=0)


def accept_route(hello: RouteHello, own: GroupKv | None, own_rank: int
                 ) -> tuple[tuple[int, int], KvLayout]:
    """A receiver's check of a route HELLO against its own cache (rank ``own_rank`` of
    ``own``): the window of its heads the route fills and the
    route's layout. ReshardError when the groups cannot be re-sharded or this rank does not
    hold the heads."""
    if own is None:
        raise ReshardError("this receiver takes no re-sharded pushes (it states no group)")
    check_reshardable(hello.group, own)
    lo = own.head_ranges[own_rank][0]
    return (hello.start - lo, hello.stop - lo), route_layout(own, own_rank, hello.start,
                                                             hello.stop)


def check_reshardable(src: GroupKv, dst: GroupKv) -> None:
    """Raise ``ReshardError`` naming the fields unless the two groups hold the same cache split
    differently (then ``routes`` moves it)."""
    a, b = src.whole(), dst.whole()
    if a.fingerprint != b.fingerprint:
        raise ReshardError("KV layouts differ beyond the split of their heads: "
                           + "; ".join(a.diff(b)))


def routes(src: GroupKv, dst: GroupKv) -> list[Route]:
    """Each head from its prefill primary to every decode rank holding it, consecutive heads
    with the same pair merged; sorted by (src, dst, start). Checks ``check_reshardable``."""
    check_reshardable(src, dst)
    out: list[Route] = []
    for d, (lo, hi) in enumerate(dst.head_ranges):
        for h in range(lo, hi):
            s = src.primary(h)
            last = out[-1] if out else None
            if last is not None and (last.src, last.dst, last.stop) == (s, d, h):
                out[-1] = replace(last, stop=h + 1)
            else:
                out.append(Route(s, d, h, h + 1, h - src.head_ranges[s][0], h - lo))
    return sorted(out, key=lambda r: (r.src, r.dst, r.start))


def parts_into(all_routes: list[Route], dst_rank: int) -> int:
    """How many routes fill decode rank ``dst_rank``'s reservation (BEGIN's ``parts``)."""
    return sum(1 for r in all_routes if r.dst == dst_rank)


def committer(all_routes: list[Route], dst_rank: int) -> int:
    """The prefill rank whose route commits decode rank ``dst_rank`` (the lowest routing
    into it; rank 0 for decode rank 0, which holds head 0 as prefill rank 0 does)."""
    return min(r.src for r in all_routes if r.dst == dst_rank)


def pushed_heads(src: GroupKv, dst: GroupKv) -> int:
    """KV heads sent for each (layer, plane, block): the model's, times the decode group's
    replicas of each."""
    return sum(r.heads for r in routes(src, dst))
