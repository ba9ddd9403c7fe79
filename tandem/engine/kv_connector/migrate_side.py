"""A running request leaving this engine with its KV: the decode role's side of a live move.

    running ──suspend──> SUSPENDED: out of the batch between two steps, its blocks pinned
        (the ledger, tandem/engine/core/remote_kv.py); what it answers is the continuation:
        every token so far (the last one sampled but its KV not computed yet) and the blocks
        holding the KV of the others
    then exactly one of:
        resume ──> back in the running batch where it stood (the move failed)
        engine.abort ──> its blocks freed (the move succeeded: another engine runs it on)

Between two steps a decode request's KV covers all its tokens but the last sampled one, which
the next step computes: that token is the one the receiving engine's commit appends, so the
request continues there exactly as it would have here (its sampling state is rebuilt from the
tokens: penalties count them, a seeded generator skips their draws, stop strings and the
grammar replay them; tandem/engine/request_factory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.remote_kv import RemoteKV
from tandem.engine.core.request import RequestStatus
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.errors import NotMovableError, UnknownRequestError
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


class MigrateSide:
    """Suspend a running request for a move, resume it (see the module docstring)."""

    def __init__(self, requests: LiveRequestHost, ledger: RemoteKV, scheduler: Scheduler,
                 kv: KVCacheManager) -> None:
        self._requests = requests
        self._ledger = ledger
        self._scheduler = scheduler
        self._kv = kv

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

    def resume(self, request_id: str) -> bool:
        """Put a suspended request back into the running batch; False when it is not
        suspended (aborted meanwhile, or never)."""
        req = self._ledger.unsuspend(request_id)
        if req is None:
            return False
        self._scheduler.admit_running(req)
        return True
