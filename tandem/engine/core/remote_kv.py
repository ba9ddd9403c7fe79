"""Requests whose KV crosses the worker boundary: reserved for a push, or held for one.

    decode role:  reserve ──> RESERVED ──commit──────────> the request runs here (leaves)
                                 ├──────end (aborted, expired)──> blocks freed (leaves)
                                 └──unreserve (local prefill)───> blocks freed, request queued
    prefill role: finish(hold_kv) ──> HELD ──release──> blocks freed, still prefix-cached
    a move:       running ──suspend──> SUSPENDED (out of the batch, blocks pinned while
                  another engine gets their KV) ──unsuspend──> running again, or aborted
                  (moved: its blocks freed)
    a move's pre-copy (its target): reserve(precopy) ──> RESERVED ──commit──> HELD: the
                  pushed full blocks prefix-cached and kept (no request runs) until the
                  move's own reservation finds them cached and references them, then
                  release (or an abort) frees the pre-copy's references

This ledger is *the* record of a reservation: each entry knows its request id, its transfer id
(an opaque tag the decode worker gives at reserve time) and its blocks.

A reservation starts from the prefix cache: the prompt's leading full blocks this engine
already holds (from an earlier turn of the same conversation, a shared system prompt) are
taken as they are, and only the blocks after them are left for the push to fill::

    prompt blocks:  [ cached | cached | fill | fill | fill (partial) ]
                      ^ ref taken, never written       ^ Reservation.fill_block_ids

The cached blocks are referenced from reserve on, so nothing evicts them before the push
lands; at least the block holding the last prompt token is always filled. With a sliding
window over every layer, the blocks wholly before the window of the first decoded token are
neither held nor pushed (``KVCacheManager.allocate_pushed``)::

    prompt blocks:  [ - | - | - | fill | fill (partial) ]       skip_tokens = 3 blocks' worth

A forked request (n sequences, tandem/engine/core/request.py) reserves its prompt once: after
``commit`` the engine forks the request's blocks to its other sequences by reference count.
kv_transfer's ``ReservationTable`` only tracks the transfer's progress on the receive path. Every transition
takes an entry out exactly once, so of two ends racing (a commit and an abort) the first wins
and the other sees None; the engine serializes them (its bookkeeping lock: tandem/engine/
async_engine.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.errors import InvalidRequestError, OutOfBlocksError, UnknownRequestError


class RemoteState(enum.Enum):
    """Why an entry's blocks are pinned."""

    RESERVED = "reserved"  # decode role: allocated, waiting for a prefill worker's push
    HELD = "held"  # prefill role: finished, kept until the push of its KV is done
    SUSPENDED = "suspended"  # a running request out of the batch while its KV is pushed away


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve`` granted: the blocks a push fills, after the prefix already here."""

    fill_block_ids: list[int]  # destination blocks of the push, in logical order
    cached_tokens: int  # leading prompt tokens whose KV is already here (whole blocks)
    # leading prompt tokens the push does not fill (whole blocks): the cached ones, or more
    # with a sliding window (those no query from the first decoded token on reads)
    skip_tokens: int = 0


@dataclass(slots=True, eq=False)
class RemoteEntry:
    """One request's pinned blocks, and what pins them."""

    request: Request
    state: RemoteState
    block_ids: list[int]
    transfer_id: str | None = None  # RESERVED only: the decode worker's tag for the push
    precopy: bool = False  # a live move's pre-copy: held, not run, once committed

    @property
    def request_id(self) -> str:
        """The request these blocks belong to."""
        return self.request.request_id


class RemoteKV:
    """Reserved and held requests over one ``KVCacheManager`` (it owns their blocks)."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._by_request: dict[str, RemoteEntry] = {}
        self._by_transfer: dict[str, RemoteEntry] = {}

    def __len__(self) -> int:
        return len(self._by_request)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_request

    @property
    def num_reserved(self) -> int:
        """Requests waiting for KV computed elsewhere."""
        return len(self._by_transfer)

    @property
    def num_held(self) -> int:
        """Finished requests whose blocks are kept for a push."""
        return sum(e.state is RemoteState.HELD for e in self._by_request.values())

    @property
    def num_suspended(self) -> int:
        """Running requests taken out of the batch while their KV is pushed away."""
        return sum(e.state is RemoteState.SUSPENDED for e in self._by_request.values())

    def request_ids(self) -> list[str]:
        """Every reserved or held request, by id."""
        return list(self._by_request)

    def get(self, request_id: str) -> RemoteEntry | None:
        """The request's entry, if it has one."""
        return self._by_request.get(request_id)

    def reserved(self, transfer_id: str) -> RemoteEntry | None:
        """The pending reservation a transfer fills, if it is still pending."""
        return self._by_transfer.get(transfer_id)

    # -- decode role -----------------------------------------------------------------------
    def reserve(self, request: Request, transfer_id: str, precopy: bool = False
                ) -> Reservation:
        """Take the cached prefix of ``request``'s tokens and allocate blocks for the rest,
        to be filled by ``transfer_id`` (``precopy``: a live move's pre-copy, which
        ``commit`` holds instead of handing over).

        Check/commit: raises InvalidRequestError (an id in use) or OutOfBlocksError (the pool
        is short) and changes nothing; else returns the blocks to fill and the cached part."""
        rid = request.request_id
        if rid in self._by_request:
            raise InvalidRequestError("request_id", f"{rid!r} is already in use")
        if not transfer_id or transfer_id in self._by_transfer:
            raise InvalidRequestError("transfer_id", f"{transfer_id!r} is empty or in use")
        if precopy and (not self.kv.enable_caching or self.kv.sliding_window is not None):
            # the move's own Reserve finds a pre-copy only through the prefix cache, from its
            # first block: without caching, or with blocks freed behind a window, it would be
            # pushed twice and hold twice the blocks meanwhile
            raise InvalidRequestError("precopy", "this worker takes no pre-copy (prefix "
                                      "caching off or a sliding window)")
        computed, n_cached = self.kv.get_computed_blocks(request)
        skip = self.kv.allocate_pushed(request, computed)
        if skip is None:
            raise OutOfBlocksError(
                f"{self.kv.blocks_needed(request.num_tokens) - len(computed)} blocks needed, "
                f"{self.kv.pool.num_free} free"
            )
        request.status = RequestStatus.WAITING_FOR_REMOTE_KV
        request.num_cached_tokens = n_cached
        entry = RemoteEntry(request, RemoteState.RESERVED, self.kv.block_ids(rid), transfer_id,
                            precopy)
        self._by_request[rid] = entry
        self._by_transfer[transfer_id] = entry
        return Reservation(entry.block_ids[skip:], n_cached, skip * self.kv.block_size)

    def commit(self, transfer_id: str) -> Request | None:
        """Every block has arrived: the request's KV is computed and its full blocks are
        indexed for prefix reuse; the blocks are now the running request's. None when the
        reservation already ended."""
        entry = self._take(transfer_id)
        if entry is None:
            return None
        req = entry.request
        req.num_computed_tokens = req.num_tokens
        self.kv.cache_full_blocks(req, req.num_tokens)
        return req

    def hold_pushed(self, transfer_id: str) -> Request | None:
        """Every block of a pre-copy has arrived: its full blocks are indexed for prefix reuse
        (``commit``) and held (HELD, ``release`` frees them) for the move's reservation to
        find. None when the reservation already ended."""
        req = self.commit(transfer_id)
        if req is not None:
            self.hold(req)
        return req

    def end(self, transfer_id: str) -> Request | None:
        """The transfer will never complete (aborted, expired): free the blocks, mark the
        request aborted. None when the reservation already ended."""
        entry = self._take(transfer_id)
        if entry is None:
            return None
        self.kv.free(entry.request_id)
        entry.request.status = RequestStatus.FINISHED_ABORTED
        return entry.request

    def unreserve(self, request_id: str) -> Request:
        """Turn a pending reservation back into a request to prefill here: blocks freed, no
        KV computed. Raises UnknownRequestError when the request has no pending one."""
        entry = self._by_request.get(request_id)
        if entry is None or entry.transfer_id is None:
            raise UnknownRequestError(request_id)
        self._take(entry.transfer_id)
        self.kv.free(request_id)
        req = entry.request
        req.num_computed_tokens = 0
        req.num_cached_tokens = -1  # measured again when it is scheduled
        return req

    def _take(self, transfer_id: str) -> RemoteEntry | None:
        entry = self._by_transfer.pop(transfer_id, None)
        if entry is not None:
            del self._by_request[entry.request_id]
        return entry

    # -- prefill role ----------------------------------------------------------------------
    def hold(self, request: Request) -> None:
        """Keep a finished ``hold_kv`` request's blocks until ``release``."""
        rid = request.request_id
        if rid in self._by_request:
            raise InvalidRequestError("request_id", f"{rid!r} already has pinned blocks")
        self._by_request[rid] = RemoteEntry(request, RemoteState.HELD, self.kv.block_ids(rid))

    def held_block_ids(self, request_id: str) -> list[int]:
        """Blocks of a held request, in logical order. Raises UnknownRequestError."""
        entry = self._by_request.get(request_id)
        if entry is None or entry.state is not RemoteState.HELD:
            raise UnknownRequestError(request_id)
        return list(entry.block_ids)

    def release(self, request_id: str) -> bool:
        """Free a held request's blocks (they stay prefix-cached). False when not held."""
        entry = self._by_request.get(request_id)
        if entry is None or entry.state is not RemoteState.HELD:
            return False
        del self._by_request[request_id]
        self.kv.free(request_id)
        return True

    # -- a move (decode role) --------------------------------------------------------------
    def suspend(self, request: Request) -> list[int]:
        """Pin a running request's blocks while it is out of the batch (the caller took it
        out); returns them in logical order."""
        rid = request.request_id
        if rid in self._by_request:
            raise InvalidRequestError("request_id", f"{rid!r} already has pinned blocks")
        entry = RemoteEntry(request, RemoteState.SUSPENDED, self.kv.block_ids(rid))
        self._by_request[rid] = entry
        return list(entry.block_ids)

    def unsuspend(self, request_id: str) -> Request | None:
        """Unpin a suspended request (it runs again, or is aborted: the caller frees its
        blocks); None when it is not suspended."""
        entry = self._by_request.get(request_id)
        if entry is None or entry.state is not RemoteState.SUSPENDED:
            return None
        del self._by_request[request_id]
        return entry.request
