"""The decode role's side of the KV connector: prompts whose KV another engine computes.

    reserve(transfer_id) ──> RESERVED: blocks allocated after the prefix cached here; the
        transfer layer writes the pushed KV into them (the engine only names them)
    then exactly one of (the ledger, tandem/engine/core/remote_kv.py, gives it to the first):
        commit / commit_forked ──> the request runs here with its first token(s), sampled
                                   on the prefill worker (a forked one: n sequences sharing
                                   the pushed blocks)
        end                    ──> the push failed (aborted, lease expired): blocks freed, the
                                   request's final "abort" output
        prefill_locally        ──> compute the prompt here after all: blocks freed, the request
                                   queued as if just added
    a live move's pre-copy (``reserve(precopy=True)``): its commit runs nothing; the pushed
        full blocks are prefix-cached and held until an abort releases them, by when the
        move's own reservation has found them cached (tandem/engine/core/remote_kv.py)

Every call checks before it changes anything: a refused reserve or commit holds nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.engine.core.output_processor import OutputProcessor
from tandem.engine.core.remote_kv import RemoteKV, Reservation
from tandem.engine.core.request import RequestStatus
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.errors import InvalidRequestError
from tandem.engine.kv_connector.host import LiveRequestHost
from tandem.engine.outputs import RequestOutput, SampleResult
from tandem.engine.sampler import skip_draw
from tandem.engine.sampling_params import SamplingParams


class DecodeSide:
    """Reserve, commit and end prompts computed elsewhere (see the module docstring)."""

    def __init__(self, requests: LiveRequestHost, ledger: RemoteKV, scheduler: Scheduler,
                 outputs: OutputProcessor, vocab_size: int) -> None:
        self._requests = requests
        self._ledger = ledger
        self._scheduler = scheduler
        self._outputs = outputs
        self._vocab_size = vocab_size

    @property
    def num_reserved(self) -> int:
        """Reservations waiting for their push."""
        return self._ledger.num_reserved

    def reserve(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        prior_output_tokens: int = 0,
        transfer_id: str | None = None,
        n: int = 1,
        precopy: bool = False,
    ) -> Reservation:
        """Allocate blocks for a prompt whose KV another engine computes, starting from the
        prefix this engine caches; returns the blocks to fill and the cached token count.

        ``transfer_id``: the caller's opaque tag for the push that fills them (default: the
        request id); ``commit`` and ``end`` name the reservation by it.
        ``prior_output_tokens`` and ``n`` as in ``LLMEngine.add_request`` (a migrated request;
        a forked one: the prompt is reserved and pushed once, ``commit_forked`` forks it).
        ``precopy``: a live move's pre-copy of ``prompt_token_ids`` (whole blocks), held once
        committed, never run. Raises InvalidRequestError or OutOfBlocksError, and then holds
        nothing."""
        live = self._requests.new_live(request_id, list(prompt_token_ids), params,
                                       prior=prior_output_tokens, n=n)
        reservation = self._ledger.reserve(live.request, transfer_id or request_id, precopy)
        self._requests.track(live)
        return reservation

    def commit(
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
        the grammar, changing nothing. A pre-copy's commit holds its blocks and runs
        nothing (its tokens are ignored): no outputs."""
        entry = self._ledger.reserved(transfer_id)
        if entry is None:
            return None
        if entry.precopy:
            self._ledger.hold_pushed(transfer_id)
            self._requests.untrack(entry.request_id)
            return []
        n = entry.request.num_forks
        lps = list(logprobs) if logprobs is not None else [None] * len(first_tokens)
        if len(first_tokens) != n or len(lps) != n:
            raise InvalidRequestError(
                "first_tokens", f"{len(first_tokens)} first tokens and {len(lps)} logprobs "
                f"for a request of {n} sequences")
        live = self._requests.live(entry.request_id)
        constraint = live.sampling.constraint
        for token in first_tokens:
            if isinstance(token, bool) or not 0 <= token < self._vocab_size:
                raise InvalidRequestError("first_token", f"{token} is outside the vocabulary")
            if constraint is not None and not constraint.allows(token):
                raise InvalidRequestError("first_token", f"{token} breaks the request's grammar")
        req = self._ledger.commit(transfer_id)
        assert req is live.request
        self._scheduler.admit_running(req)
        family = [live] + self._requests.fork(live)
        outs = []
        for seq, token, lp in zip(family, first_tokens, lps, strict=True):
            skip_draw(seq.sampling)  # the first token was drawn on the prefill worker
            outs.append(self._requests.append(seq, [SampleResult(token, lp, None)]))
        return outs

    def end(self, transfer_id: str) -> RequestOutput | None:
        """The push into a reservation failed (aborted, lease expired): free its blocks and
        return its request's final "abort" output. None when it already ended."""
        req = self._ledger.end(transfer_id)
        if req is None:
            return None
        live = self._requests.untrack(req.request_id)
        return self._outputs.finish(req, live.detok, RequestStatus.FINISHED_ABORTED)

    def prefill_locally(self, request_id: str) -> None:
        """Compute a reserved prompt here after all (the colocated fallback): the reservation
        ends, its blocks are freed and the request is queued as if just added, with the
        prompt, params and prior tokens given at reserve time. Raises UnknownRequestError
        when the request has no pending reservation."""
        self._scheduler.add(self._ledger.unreserve(request_id))
