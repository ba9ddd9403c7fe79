"""KV blocks of a simulated worker: reservations and the prefix cache, counted not stored.

A decode worker's blocks are in one of three states::

    free  --reserve-->  reserved (a request's own blocks)  --release-->  free
                                                            \\--keep--> cached
    cached (a prefix group's entry):  pinned (refs > 0)  or  evictable (LRU)

A prefix entry is a group's leading tokens in whole blocks (tandem/planner/trace.py: a request of
the group shares ``min(entry, its prefix_tokens)`` of them). A reservation pins the entry it
reuses, so the blocks it reads cannot be evicted under it; unpinned entries are evicted
oldest first when a reservation needs their room. What a worker reports as free (and the
router ranks by) counts evictable blocks as free, as the engine's block pool does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class PrefixEntry:
    """A prefix group's cached blocks on one worker and the reservations reading them."""

    blocks: int
    refs: int = 0


class DecodeBlocks:
    """Block accounting of one decode worker (see the module docstring).

    ``holders`` is the router's index of who caches which group: this worker adds ``owner``
    to ``holders[group]`` when it caches the group and removes it on eviction.
    """

    __slots__ = ("num_blocks", "block_size", "raw_free", "evictable", "reserved",
                 "cached", "entries", "_lru", "_holders", "_owner")

    def __init__(self, num_blocks: int, block_size: int, holders: dict[int, set[Any]],
                 owner: Any) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.raw_free = num_blocks  # neither reserved nor cached
        self.evictable = 0  # cached blocks no reservation pins
        self.reserved = 0
        self.cached = 0
        self.entries: dict[int, PrefixEntry] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned entries, oldest first
        self._holders = holders
        self._owner = owner

    @property
    def free(self) -> int:
        """Blocks a reservation could get (free plus evictable): what the worker reports."""
        return self.raw_free + self.evictable

    def matched_blocks(self, group: int, cap_tokens: int) -> int:
        """Leading blocks of a request of ``group`` sharing ``cap_tokens`` that are cached."""
        entry = self.entries.get(group)
        if entry is None:
            return 0
        return min(entry.blocks, cap_tokens // self.block_size)

    def reserve(self, group: int, matched: int, new: int) -> bool:
        """Hold ``new`` blocks and pin ``group``'s entry when ``matched`` > 0; False (nothing
        changed) when even evicting every unpinned entry leaves too little room."""
        entry = self.entries.get(group) if matched > 0 else None
        room = self.raw_free + self.evictable
        if entry is not None and entry.refs == 0:
            room -= entry.blocks  # pinning it takes it out of the evictable pool
        if new > room:
            return False
        if entry is not None:
            if entry.refs == 0:
                del self._lru[group]
                self.evictable -= entry.blocks
            entry.refs += 1
        while self.raw_free < new:
            self._evict_oldest()
        self.raw_free -= new
        self.reserved += new
        return True

    def release(self, group: int, pinned: bool, private: int,
                keep: Iterable[tuple[int, int]]) -> None:
        """A reservation ends: unpin ``group``'s entry, cache ``keep`` ((group, tokens) its
        blocks now hold for later requests), free the rest of its ``private`` blocks."""
        self.reserved -= private
        if pinned:
            entry = self.entries[group]
            entry.refs -= 1
            if entry.refs == 0:
                self._lru[group] = None
                self.evictable += entry.blocks
        for g, tokens in keep:
            want = tokens // self.block_size
            if g < 0 or want <= 0:
                continue
            entry = self.entries.get(g)
            extra = want - (entry.blocks if entry is not None else 0)
            if extra <= 0:
                if entry is not None and entry.refs == 0:
                    self._lru.move_to_end(g)
                continue
            take = min(extra, private)
            private -= take
            # Blocks another entry holds too (a conversation's system prompt) are copied
            # from free ones: a small overcount of the cache, never of reservations.
            copy = min(extra - take, self.raw_free)
            self.raw_free -= copy
            take += copy
            if take == 0:
                continue
            self.cached += take
            if entry is None:
                self.entries[g] = PrefixEntry(take)
                self._lru[g] = None
                self.evictable += take
                self._holders.setdefault(g, set()).add(self._owner)
            else:
                entry.blocks += take
                if entry.refs == 0:
                    self.evictable += take
                    self._lru.move_to_end(g)
        self.raw_free += private

    def _evict_oldest(self) -> None:
        group, _ = self._lru.popitem(last=False)
        entry = self.entries.pop(group)
        self.evictable -= entry.blocks
        self.cached -= entry.blocks
        self.raw_free += entry.blocks
        holders = self._holders.get(group)
        if holders is not None:
            holders.discard(self._owner)

    def forget_all(self) -> None:
        """The worker left the pool: the router's index forgets it, now and from now on."""
        for group in self.entries:
            holders = self._holders.get(group)
            if holders is not None:
                holders.discard(self._owner)
        self._holders = {}

    def leaked(self) -> int:
        """Blocks unaccounted for, plus blocks still reserved or pinned (0 once idle)."""
        pins = sum(e.blocks for e in self.entries.values() if e.refs > 0)
        lost = self.num_blocks - self.raw_free - self.reserved - self.cached
        return abs(lost) + self.reserved + pins


class PrefixLru:
    """A prefill worker's prefix cache: groups' leading blocks, LRU within ``capacity``
    blocks. Blocks of prompts being prefilled are not counted (they leave with the push)."""

    __slots__ = ("capacity", "block_size", "used", "entries")

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.used = 0
        self.entries: OrderedDict[int, int] = OrderedDict()  # group -> blocks, oldest first

    def tokens(self, group: int) -> int:
        """Cached leading tokens of ``group`` (0: none); a hit makes the entry recent."""
        blocks = self.entries.get(group)
        if blocks is None:
            return 0
        self.entries.move_to_end(group)
        return blocks * self.block_size

    def peek(self, group: int) -> int:
        """Like :meth:`tokens` without touching the LRU order (the router's look)."""
        return self.entries.get(group, 0) * self.block_size

    def insert(self, group: int, tokens: int) -> None:
        """``group``'s first ``tokens`` are now cached (whole blocks)."""
        want = tokens // self.block_size
        if group < 0 or want <= 0 or want > self.capacity:
            return
        have = self.entries.get(group, 0)
        if want > have:
            self.entries[group] = want
            self.used += want - have
        self.entries.move_to_end(group)
        while self.used > self.capacity:
            _, blocks = self.entries.popitem(last=False)
            self.used -= blocks
