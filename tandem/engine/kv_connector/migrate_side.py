"""A running request leaving this engine with its KV: the decode role's side of a live move.

    running ──suspend──> SUSPENDED: out of the batch between two steps, its blocks pinned
        (the ledger, tandem/engine/core/remote_kv.py); what it answers is the continuation:
        every token so far (the last one sampled but its KV not computed yet) and the blocks
        holding the KV of the others
    then exactly one of:
        resume ──> back in the running batch where it stood (the move failed)
        engine.abort ──> its blocks freed (the move succeeded: another engine runs it on)

    a pre-copy, before the suspend: running ──pin──> its leading full blocks referenced by a
        pin of their own (the request decodes on; those blocks are never written again, and
        the pin keeps them if the request ends meanwhile) ──unpin──> the pin's references
        dropped (the push of the blocks is over)

Between two steps a decode request's KV covers all its tokens but the last sampled one, which
the next step computes: that token is the one the receiving engine's commit appends, so the
request continues there exactly as it would have here (its sampling state is rebuilt from the
tokens: penalties count them, a seeded generator skips their draws, stop strings and the
grammar replay them; tandem/engine/request_factory.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.remote_kv import RemoteKV
from tandem.engine.core.request import FORK_SEPARATOR, RequestStatus
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.errors import InvalidRequestError, NotMovableError, UnknownRequestError
from tandem.engine.kv_connector.host import LiveRequestHost


@dataclass(frozen=True, slots=True)
class Suspended:
    """A suspended request's continuation: ``token_ids`` (prompt + every output token; the
    KV of all but the last is in ``block_ids``, in logical order: ``FREED`` for those behind
    a sliding window, which the target's reservation skips too), how many of them are
    output, and the LoRA adapter it runs under (its name here; "": the base model)."""

    token_ids: list[int]
    num_output_tokens: int
    block_ids: list[int]
    lora: str = ""


@dataclass(frozen=True, slots=True)
class Pinned:
    """A pre-copy's pin: its id (for ``unpin``) and the pinned blocks, in logical order
    (``FREED`` behind a sliding window)."""

    pin_id: str
    block_ids: list[int]


class MigrateSide:
    """Suspend a running request for a move, resume it (see the module docstring)."""

    def __init__(self, requests: LiveRequestHost, ledger: RemoteKV, scheduler: Scheduler,
                 kv: KVCacheManager) -> None:
        self._requests = requests
        self._ledger = ledger
        self._scheduler = scheduler
        self._kv = kv
        # a pin's id starts with the fork separator: never a request's (nor a sequence's)
        self._pin_ids = (f"{FORK_SEPARATOR}pin{FORK_SEPARATOR}{i}" for i in itertools.count())
        self._pins: set[str] = set()

    @property
    def num_suspended(self) -> int:
        """Requests out of the batch while their KV is pushed away."""
        return self._ledger.num_suspended

    def suspend(self, request_id: str) -> Suspended:
        """Take a decoding request out of the batch with its blocks pinned. Raises
        UnknownRequestError, or NotMovableError (changing nothing) when it is not decoding
        here now."""
        try:
            req = self._requests.live(request_id).request
        except KeyError:
            raise UnknownRequestError(request_id) from None
        if request_id in self._ledger or req.status is not RequestStatus.RUNNING:
            raise NotMovableError(f"request {request_id!r} is not decoding here "
                                  f"({req.status.value})")
        if req.num_output_tokens < 1 or req.num_computed_tokens != req.num_tokens - 1:
            raise NotMovableError(f"request {request_id!r} is still prefilling")
        if req.num_forks > 1:
            raise NotMovableError(f"request {request_id!r} has not forked yet")
        needed = self._kv.blocks_needed(req.num_computed_tokens)
        self._scheduler.remove(req)
        blocks = self._ledger.suspend(req)
        return Suspended(list(req.all_token_ids), req.num_output_tokens, blocks[:needed],
                         req.lora)

    def pin_ids(self) -> list[str]:
        """The pins held now (each references blocks: the engine's leak count knows them)."""
        return list(self._pins)

    def pin(self, request_id: str, token_ids: list[int]) -> Pinned:
        """Pin the blocks of a running request's leading ``token_ids`` (whole blocks, their
        KV computed) for a pre-copy; the request runs on. Raises UnknownRequestError,
        NotMovableError (not decoding here, or those tokens not computed yet) or
        InvalidRequestError (not whole blocks, or not the request's tokens), pinning
        nothing."""
        try:
            req = self._requests.live(request_id).request
        except KeyError:
            raise UnknownRequestError(request_id) from None
        if request_id in self._ledger or req.status is not RequestStatus.RUNNING:
            raise NotMovableError(f"request {request_id!r} is not decoding here "
                                  f"({req.status.value})")
        bs, n = self._kv.block_size, len(token_ids)
        if n == 0 or n % bs:
            raise InvalidRequestError("token_ids", f"{n} tokens are not whole blocks of {bs}")
        if req.num_computed_tokens < n:
            raise NotMovableError(f"request {request_id!r} has computed "
                                  f"{req.num_computed_tokens} tokens, not {n}")
        if req.all_token_ids[:n] != list(token_ids):
            raise InvalidRequestError("token_ids", f"not the leading {n} tokens of request "
                                      f"{request_id!r}")
        pin_id = next(self._pin_ids)
        blocks = self._kv.pin(pin_id, request_id, n // bs)
        self._pins.add(pin_id)
        return Pinned(pin_id, blocks)

    def unpin(self, pin_id: str) -> None:
        """Drop a pin's references (no-op when it is not held)."""
        if pin_id in self._pins:
            self._pins.discard(pin_id)
            self._kv.free(pin_id)

    def resume(self, request_id: str) -> bool:
        """Put a suspended request back into the running batch; False when it is not
        suspended (aborted meanwhile, or never)."""
        req = self._ledger.unsuspend(request_id)
        if req is None:
            return False
        self._scheduler.admit_running(req)
        return True
