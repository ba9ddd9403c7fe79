"""Which blocks each request holds, and prefix-cache lookups over hash-chained blocks.

    request tokens:  [ t0 .. t15 | t16 .. t31 | t32 .. t40 ]     block_size = 16
    block hashes:      h0 = H(-, b0)  h1 = H(h0, b1)   (partial: no hash)

A new request walks h0, h1, ... in the pool's index and reuses every block that matches, so
its prefill starts after the shared prefix. Allocation is a check/commit pair: either every
block a step needs is granted, or nothing changes.

A forked request's sequences share its prompt's blocks (``fork``: one more reference each).
Full blocks are never written again; the last, partial one is copied on write: the first
time a sequence writes into a block it shares, it gets a block of its own and the engine
copies the shared block's KV into it before the step runs (``take_copies``)::

    seq 0: [ b0 | b1 | b2 (partial) ]      seq 0 writes first:  [ b0 | b1 | b3 := copy(b2) ]
    seq 1: [ b0 | b1 | b2 (partial) ]      seq 1 (last owner):  [ b0 | b1 | b2 ] written in place

Sliding window (``sliding_window`` W: every layer of the model slides, W the widest): a query
at position p reads keys p - W + 1 .. p only, so once a request's next token to compute is at
position s, the blocks wholly before s - W + 1 are read by nobody. ``allocate_slots`` frees
them before it allocates, keeping the request's logical block list as long as before with
``None`` in their place (``block_ids`` says -1 there: the attention backends never read those
entries)::

    W = 6, bs = 4, s = 13:  keys 8 .. 12 are still read
    [ b0 | b1 | b2 | b3 ]  ->  [ - | - | b2 | b3 ]       b0, b1 back in the pool

A freed block keeps its hash and its KV until the pool hands it out again (and then its hash is
dropped first), so a prefix-cache hit on it is still exact. Prefix hits that lie wholly behind
a new request's window are not taken at all. A request holding its KV for a push (``hold_kv``,
the prefill role) frees the same way as its chunked prefill advances, but never past the
blocks its decode worker's reservation skips (``Request.push_skip_tokens``): a decode worker
that keeps every block (one running a draft model, which frees nothing behind the window, or
one that reports no skip) gets the whole prompt pushed.

A prompt another engine computes (the decode role's reservation, ``allocate_pushed``) gets only
the blocks its first decoded token's window reads, ``None`` before them: the push fills those
and no others (with a window of 6 and blocks of 4, a 13-token prompt's first decoded token,
at position 13, reads keys 8 .. 13: blocks b2, b3 and the one it writes)::

    [ - | - | b2 | b3 ]          skip = 2 blocks: the push ships 2 of the prompt's 4
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tandem.common.block_hash import hash_block
from tandem.engine.core.block_pool import Block, BlockPool
from tandem.engine.core.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters of prefix-cache lookups, in tokens."""

    queries: int = 0
    hits: int = 0


FREED = -1  # block_ids' entry for a block freed behind a sliding window


class KVCacheManager:
    """Maps requests to blocks of one ``BlockPool``; ``sliding_window``: free the blocks
    behind every request's window as it advances (module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks, enable_caching)
        # a request's blocks in logical order; None: freed behind its sliding window
        self._blocks: dict[str, list[Block | None]] = {}
        self._hashes: dict[str, list[int]] = {}  # hashes of the request's full blocks, in order
        # copy-on-write copies the next step must make first: dst block id -> (src, owner)
        self._copies: dict[int, tuple[int, str]] = {}
        self.stats = PrefixCacheStats()

    # -- queries ---------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        """Physical block ids of a request, in logical order (``FREED`` for a block freed
        behind its sliding window)."""
        return [FREED if b is None else b.block_id for b in self._blocks.get(request_id, ())]

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request references now (those freed behind its window not counted)."""
        return sum(1 for b in self._blocks.get(request_id, ()) if b is not None)

    def holds(self, request_id: str) -> bool:
        """True when the request currently holds blocks."""
        return request_id in self._blocks

    def stranded_blocks(self, live: Iterable[str]) -> int:
        """Blocks in use that none of the ``live`` requests holds: a request that left without
        ``free``, or a reference that outlived its owners. 0 unless something leaked (below 0:
        a block freed while still held)."""
        owned = {b.block_id for rid in live for b in self._blocks.get(rid, ()) if b is not None}
        return self.pool.num_blocks - self.pool.num_free - len(owned)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of full blocks, leaving at least one token to compute."""
        if not self.enable_caching:
            return [], 0
        hashes = self._request_hashes(request)
        # The last token must be computed to produce logits, so never hit on all of them.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[Block] = []
        for h in hashes[:max_blocks]:
            block = self.pool.get_cached(h)
            if block is None:
                break
            hits.append(block)
        self.stats.queries += request.num_tokens
        self.stats.hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    # -- check / commit ----------------------------------------------------------------------
    def can_allocate(
        self, request: Request, num_new_tokens: int, computed: list[Block] | None = None
    ) -> bool:
        """Would ``allocate_slots`` succeed? Changes nothing."""
        return self._new_blocks_needed(request, num_new_tokens, computed) <= self._available(
            request, computed
        )

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed: list[Block] | None = None,
        cache_tokens: bool = True,
    ) -> bool:
        """Grant the blocks for ``num_new_tokens`` more tokens, or return False and change nothing.

        ``computed`` are prefix-cache hits from ``get_computed_blocks`` (first scheduling only).
        With ``cache_tokens`` the full blocks covered after this step are indexed for reuse.
        With a sliding window, the blocks behind the request's window are freed first (and
        count as available: module docstring).
        """
        need = self._new_blocks_needed(request, num_new_tokens, computed)
        if need > self._available(request, computed):
            return False
        blocks = self._blocks.setdefault(request.request_id, [])
        self._free_behind_window(request, blocks)
        for i in self._shared_written(request, num_new_tokens, computed):
            self._copy_on_write(request.request_id, blocks, i)
        if computed:
            behind = min(len(computed), self._behind_window(request, computed))
            taken = computed[behind:]
            self.pool.touch(taken)
            blocks.extend([None] * behind)
            blocks.extend(taken)
        if need > 0:
            blocks.extend(self.pool.allocate(need))
        if cache_tokens:
            done = len(computed or ()) * self.block_size + request.num_computed_tokens
            self.cache_full_blocks(request, min(done + num_new_tokens, request.num_tokens))
        return True

    def allocate_pushed(self, request: Request, computed: list[Block]) -> int | None:
        """Grant the blocks of a prompt whose KV another engine computes and pushes; returns
        how many leading blocks the push does not fill, or None when the pool is short
        (nothing changed). Those are the prefix hits ``computed`` taken as they are and, with
        a sliding window, every block wholly before the window of the first decoded token
        (``None`` in their place, as if freed behind it; module docstring). At least the
        block holding the last prompt token is filled. The request must hold nothing yet."""
        total = self.blocks_needed(request.num_tokens)
        behind = min(self._window_start_block(request.num_tokens), total - 1)
        taken = computed[behind:]
        skip = max(behind, len(computed))
        need = total - skip
        if need > self.pool.num_free - sum(1 for b in taken if b.ref_cnt == 0):
            return None
        blocks = self._blocks.setdefault(request.request_id, [])
        if blocks:
            raise RuntimeError(f"{request.request_id!r} already holds blocks")
        self.pool.touch(taken)
        blocks.extend([None] * behind)
        blocks.extend(taken)
        blocks.extend(self.pool.allocate(need))
        return skip

    def cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's blocks fully covered by its first ``num_tokens`` tokens."""
        if not self.enable_caching:
            return
        blocks = self._blocks.get(request.request_id, [])
        hashes = self._request_hashes(request)
        for i in range(min(num_tokens // self.block_size, len(blocks), len(hashes))):
            block = blocks[i]
            if block is not None:
                self.pool.cache(block, hashes[i])

    def fork(self, parent_id: str, child_id: str) -> None:
        """``child_id`` takes a reference on every block of ``parent_id``: a new sequence of
        a forked request, sharing its computed prompt (copied on write, see the module
        docstring). The child's id must hold nothing yet."""
        if child_id in self._blocks:
            raise RuntimeError(f"{child_id!r} already holds blocks")
        blocks = self._blocks[parent_id]
        self.pool.touch(b for b in blocks if b is not None)
        self._blocks[child_id] = list(blocks)
        self._hashes[child_id] = list(self._hashes.get(parent_id, ()))

    def pin(self, pin_id: str, request_id: str, num_blocks: int) -> list[int]:
        """``pin_id`` takes a reference on the first ``num_blocks`` blocks of ``request_id``
        (full, computed blocks, which nobody writes again: no copy on write follows), so they
        outlive the request while another engine reads them (a live move's pre-copy);
        ``free(pin_id)`` drops it. Returns their ids (``FREED`` behind a sliding window, not
        referenced). ``pin_id`` must hold nothing and the request at least that many blocks."""
        if pin_id in self._blocks:
            raise RuntimeError(f"{pin_id!r} already holds blocks")
        blocks = self._blocks.get(request_id, [])[:num_blocks]
        if len(blocks) < num_blocks:
            raise RuntimeError(f"{request_id!r} holds {len(blocks)} blocks, not {num_blocks}")
        self.pool.touch(b for b in blocks if b is not None)
        self._blocks[pin_id] = list(blocks)
        return [FREED if b is None else b.block_id for b in blocks]

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies copy-on-write granted since the last call: the engine
        makes them before the step's forward writes anything."""
        copies = [(src, dst) for dst, (src, _) in self._copies.items()]
        self._copies.clear()
        return copies

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Free the request's trailing blocks beyond those holding ``num_tokens`` tokens
        (speculative rollback: rejected draft slots never reach a full, cached block)."""
        blocks = self._blocks.get(request_id)
        if not blocks:
            return
        keep = self.blocks_needed(num_tokens)
        if len(blocks) > keep:
            tail = [b for b in blocks[keep:] if b is not None]
            del blocks[keep:]
            self.pool.free(reversed(tail))

    def free(self, request_id: str) -> None:
        """Release every block of a request (tail first, so the prefix stays cached longest)."""
        blocks = self._blocks.pop(request_id, None)
        self._hashes.pop(request_id, None)
        if blocks:
            held = [b for b in blocks if b is not None]
            for b in held:  # a copy granted to a request preempted in the same schedule
                if self._copies.get(b.block_id, (0, ""))[1] == request_id:
                    del self._copies[b.block_id]
            self.pool.free(reversed(held))

    # -- internals ---------------------------------------------------------------------------
    def _new_blocks_needed(
        self, request: Request, num_new_tokens: int, computed: list[Block] | None
    ) -> int:
        held = len(self._blocks.get(request.request_id, ())) + len(computed or ())
        start = request.num_computed_tokens + len(computed or ()) * self.block_size
        cow = len(self._shared_written(request, num_new_tokens, computed))
        return max(0, self.blocks_needed(start + num_new_tokens) - held) + cow

    def _shared_written(
        self, request: Request, num_new_tokens: int, computed: list[Block] | None
    ) -> list[int]:
        """Indexes of the request's blocks that the next ``num_new_tokens`` tokens write and
        that another sequence still references (a fork's partial block: copy on write). A
        request given prefix hits holds nothing yet, and hits are never written."""
        blocks = self._blocks.get(request.request_id)
        if computed or not blocks or num_new_tokens <= 0:
            return []
        start = request.num_computed_tokens
        end = min(len(blocks), self.blocks_needed(start + num_new_tokens))
        # written blocks are never behind the window (it ends at the first written position)
        return [i for i in range(start // self.block_size, end)
                if (b := blocks[i]) is not None and b.ref_cnt > 1]

    def _copy_on_write(self, request_id: str, blocks: list[Block | None], i: int) -> None:
        """Give the request a block of its own in place of shared ``blocks[i]``; the KV is
        copied before the next forward (``take_copies``)."""
        shared = blocks[i]
        assert shared is not None
        (own,) = self.pool.allocate(1)
        self._copies[own.block_id] = (shared.block_id, request_id)
        blocks[i] = own
        self.pool.free([shared])  # others still hold it: never back in the free queue here

    def _available(self, request: Request, computed: list[Block] | None) -> int:
        """Blocks ``allocate_slots`` could hand out: the free ones, plus those freeing the
        request's blocks behind its window returns to the pool, less the idle prefix hits it
        takes (touched, they stop being allocatable)."""
        behind = self._behind_window(request, computed)
        taken = (computed or [])[behind:]
        idle_hits = sum(1 for b in taken if b.ref_cnt == 0)
        held = self._blocks.get(request.request_id, ())
        returned = sum(1 for b in held[:behind] if b is not None and b.ref_cnt == 1)
        return self.pool.num_free - idle_hits + returned

    def _behind_window(self, request: Request, computed: Sequence[Block] | None) -> int:
        """Leading blocks of the request that no query from its next token to compute on
        reads: those wholly before that token's window (0 without a window). A request held
        for a push keeps every block its push ships: at most the blocks its reservation skips
        (``push_skip_tokens``) are behind."""
        start = request.num_computed_tokens + len(computed or ()) * self.block_size
        behind = self._window_start_block(start)
        if request.hold_kv:
            behind = min(behind, request.push_skip_tokens // self.block_size)
        return behind

    def _window_start_block(self, position: int) -> int:
        """Leading blocks wholly before the window of a query at ``position`` (0 without a
        window): keys position - W + 1 .. position are read."""
        if self.sliding_window is None:
            return 0
        return max(0, position - self.sliding_window + 1) // self.block_size

    def _free_behind_window(self, request: Request, blocks: list[Block | None]) -> None:
        """Drop the request's references on its blocks behind its window (``None`` in their
        place; newest first into the free queue, as ``free`` does)."""
        behind = min(len(blocks), self._behind_window(request, None))
        dropped = [b for b in blocks[:behind] if b is not None]
        if dropped:
            blocks[:behind] = [None] * behind
            self.pool.free(reversed(dropped))

    def _request_hashes(self, request: Request) -> list[int]:
        """Hashes of the request's full blocks, extended incrementally as tokens arrive."""
        hashes = self._hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        bs = self.block_size
        for i in range(len(hashes), len(tokens) // bs):
            hashes.append(hash_block(hashes[-1] if hashes else None,
                                     tokens[i * bs : (i + 1) * bs], request.cache_salt))
        return hashes
