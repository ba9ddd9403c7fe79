"""The engine's side of disaggregation: the KV hooks both worker roles call (DESIGN.md section 2).

    prefill role: add_request(hold_kv=True, max_tokens=1) runs the prompt; held_block_ids()
                  names its blocks for the push; release() when the push is done
    decode role:  reserve_remote(transfer_id=...) allocates blocks for a prompt computed
                  elsewhere (from the prefix cached here); the transfer layer writes them into
                  kv_cache; then exactly one of commit_remote / commit_forked (admit with the
                  first token(s)), end_remote (the push failed) or prefill_reserved_locally
                  (compute the prompt here after all)

``RemoteKVHooks`` is a mixin of :class:`tandem.engine.llm_engine.LLMEngine` (its only user): it holds
no state, and reads the engine's (the annotations below); the ledger of reservations and held
requests is tandem/engine/core/remote_kv.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.output_processor import OutputProcessor
from tandem.engine.core.remote_kv import RemoteKV, Reservation
from tandem.engine.core.request import RequestStatus
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.errors import InvalidRequestError
from tandem.engine.model_runner import ModelRunner
from tandem.engine.models.arch import ModelArch
from tandem.engine.outputs import KVCacheSpec, RequestOutput, SampleResult
from tandem.engine.request_factory import LiveRequest
from tandem.engine.sampler import skip_draw
from tandem.engine.sampling_params import SamplingParams


class RemoteKVHooks:
    """reserve/commit/end for the decode role, held blocks for the prefill role."""

    # The engine's state these hooks work on (LLMEngine sets every one).
    runner: ModelRunner
    arch: ModelArch
    model_path: Path
    dtype: torch.dtype
    kv: KVCacheManager
    remote: RemoteKV
    scheduler: Scheduler
    outputs: OutputProcessor
    _live: dict[str, LiveRequest]

    if TYPE_CHECKING:  # LLMEngine's own methods these hooks call
        def _new_live(self, request_id: str, prompt: str | Sequence[int],
                      params: SamplingParams, hold_kv: bool, prior: int = 0, n: int = 1,
                      ) -> LiveRequest: ...

        def _fork(self, live: LiveRequest) -> list[LiveRequest]: ...

        def _append(self, live: LiveRequest, results: list[SampleResult]) -> RequestOutput: ...

    @property
    def kv_cache(self) -> torch.Tensor:
        """The cache tensor ``[layers, 2, num_blocks, block_size, kv_heads, row_width]``."""
        return self.runner.kv_cache

    def kv_cache_spec(self) -> KVCacheSpec:
        """What the cache tensor holds (the workers build kv_transfer's layout from it)."""
        cache, arch = self.kv_cache, self.arch
        return KVCacheSpec(
            model=self.model_path.name,
            dtype=str(self.dtype).removeprefix("torch."),
            kv_dtype=str(cache.dtype).removeprefix("torch."),
            block_size=self.kv.block_size,
            num_layers=arch.num_layers,
            num_kv_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
            # an int8 cache carries a scale after each head vector (tandem/engine/quant/kv_int8.py)
            scale_bytes=(cache.shape[-1] - arch.head_dim) * cache.element_size(),
        )

    def held_block_ids(self, request_id: str) -> list[int]:
        """Blocks of a finished ``hold_kv`` request, in logical order."""
        return self.remote.held_block_ids(request_id)

    def release(self, request_id: str) -> None:
        """Free a held request's blocks (they stay in the prefix cache). Idempotent."""
        self.remote.release(request_id)

    def reserve_remote(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        prior_output_tokens: int = 0,
        transfer_id: str | None = None,
        n: int = 1,
    ) -> Reservation:
        """Allocate blocks for a prompt whose KV another engine computes, starting from the
        prefix this engine caches; returns the blocks to fill and the cached token count.

        ``transfer_id``: the caller's opaque tag for the push that fills them (default: the
        request id); ``commit_remote`` and ``end_remote`` name the reservation by it.
        ``prior_output_tokens`` and ``n`` as in ``add_request`` (a migrated request; a forked
        one: the prompt is reserved and pushed once, ``commit_forked`` forks it). Raises
        InvalidRequestError or OutOfBlocksError, and then holds nothing."""
        live = self._new_live(
            request_id, list(prompt_token_ids), params, hold_kv=False, prior=prior_output_tokens,
            n=n,
        )
        reservation = self.remote.reserve(live.request, transfer_id or request_id)
        self._live[request_id] = live
        return reservation

    def commit_remote(
        self, transfer_id: str, first_token: int, logprob: float | None = None
    ) -> RequestOutput | None:
        """The KV of a one-sequence reservation has arrived: admit its request with its first
        sampled token (``commit_forked`` with one token)."""
        outs = self.commit_forked(transfer_id, [first_token], [logprob])
        return outs[0] if outs is not None else None

    def commit_forked(
        self,
        transfer_id: str,
        first_tokens: Sequence[int],
        logprobs: Sequence[float | None] | None = None,
    ) -> list[RequestOutput] | None:
        """The KV of a reservation has arrived: admit its request with the first token of
        each of its n sequences (``first_tokens[j]`` sampled elsewhere with seed + j), sequences
        1..n-1 forked from it sharing the pushed blocks; returns their outputs in order.
        None when the reservation already ended (aborted, expired, prefilled here). Raises
        InvalidRequestError for a count other than n or a token outside the vocabulary or
        the grammar, changing nothing."""
        entry = self.remote.reserved(transfer_id)
        if entry is None:
            return None
        n = entry.request.num_forks
        lps = list(logprobs) if logprobs is not None else [None] * len(first_tokens)
        if len(first_tokens) != n or len(lps) != n:
            raise InvalidRequestError(
                "first_tokens", f"{len(first_tokens)} first tokens and {len(lps)} logprobs "
                f"for a request of {n} sequences")
        constraint = self._live[entry.request_id].sampling.constraint
        for token in first_tokens:
            if isinstance(token, bool) or not 0 <= token < self.arch.vocab_size:
                raise InvalidRequestError("first_token", f"{token} is outside the vocabulary")
            if constraint is not None and not constraint.allows(token):
                raise InvalidRequestError("first_token", f"{token} breaks the request's grammar")
        req = self.remote.commit(transfer_id)
        assert req is not None
        live = self._live[req.request_id]
        self.scheduler.admit_running(req)
        family = [live] + self._fork(live)
        outs = []
        for seq, token, lp in zip(family, first_tokens, lps, strict=True):
            skip_draw(seq.sampling)  # the first token was drawn on the prefill worker
            outs.append(self._append(seq, [SampleResult(token, lp, None)]))
        return outs

    def end_remote(self, transfer_id: str) -> RequestOutput | None:
        """The push into a reservation failed (aborted, lease expired): free its blocks and
        return its request's final "abort" output. None when it already ended."""
        req = self.remote.end(transfer_id)
        if req is None:
            return None
        live = self._live.pop(req.request_id)
        return self.outputs.finish(req, live.detok, RequestStatus.FINISHED_ABORTED)

    def prefill_reserved_locally(self, request_id: str) -> None:
        """Compute a reserved prompt here after all (the colocated fallback): the reservation
        ends, its blocks are freed and the request is queued as if just added, with the
        prompt, params and prior tokens given at reserve time. Raises UnknownRequestError
        when the request has no pending reservation."""
        self.scheduler.add(self.remote.unreserve(request_id))
