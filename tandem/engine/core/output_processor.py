"""After the sampler: append each request's tokens, detokenize, check stops, build outputs.

    SampleResult(s) of one request ──> append token ──> text delta ──> stop? ──> RequestOutput
                                          └─ several after a speculative step, in order;
                                             nothing past the first stop is emitted

A request's first output also carries its prompt logprobs when it asked for them (scored
into the Request chunk by chunk, tandem/engine/prompt_logprobs.py). A request that stops is marked
FINISHED_* here; the engine then takes it out of the scheduler and frees (or holds) its
blocks. Pure bookkeeping: the detokenizer comes in as an object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.outputs import RequestOutput, SampleResult, TokenLogprob


class Detokenizer(Protocol):
    """What the output processor needs of ``tandem.engine.detokenizer.IncrementalDetokenizer``."""

    @property
    def text(self) -> str:
        """All text handed out so far."""
        ...

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched, or None."""
        ...

    def add(self, token_id: int) -> str:
        """Append one token; return the text it finalized."""
        ...

    def flush(self) -> str:
        """On finish, the text still held back."""
        ...


class OutputProcessor:
    """Turns sampled tokens into ``RequestOutput``s for one engine."""

    def __init__(self, eos_token_ids: frozenset[int], max_model_len: int) -> None:
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.num_generated_tokens = 0

    def append(
        self, req: Request, detok: Detokenizer | None, results: Sequence[SampleResult]
    ) -> RequestOutput:
        """Append sampled tokens in order, stopping at the first that finishes the request
        (its output is then ``finished`` and ``req.status`` says why)."""
        new_ids: list[int] = []
        delta = ""
        lp: list[TokenLogprob] | None = None
        prompt_lps = take_prompt_logprobs(req)
        for res in results:
            req.append_token(res.token_id)
            new_ids.append(res.token_id)
            self.num_generated_tokens += 1
            delta += detok.add(res.token_id) if detok is not None else ""
            if req.params.logprobs is not None and res.logprob is not None:
                lp = lp or []
                lp.append(TokenLogprob(res.token_id, res.logprob, res.top_logprobs or []))
            status = self.check_stop(req, detok, res.token_id)
            if status is not None:
                req.status = status
                if detok is not None:
                    delta += detok.flush()
                return self.output(req, detok, new_ids, lp, delta, finished=True,
                                   prompt_logprobs=prompt_lps)
        return self.output(req, detok, new_ids, lp, delta, prompt_logprobs=prompt_lps)

    def check_stop(
        self, req: Request, detok: Detokenizer | None, token: int
    ) -> RequestStatus | None:
        """Why ``token`` (just appended) ends the request, or None: EOS, a stop token or stop
        string once ``min_tokens`` are out; ``max_tokens`` or the context length."""
        p = req.params
        n_out = req.num_output_tokens
        if n_out >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in p.stop_token_ids:
                req.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
            if detok is not None and detok.stop_reason is not None:
                req.stop_reason = detok.stop_reason
                return RequestStatus.FINISHED_STOPPED
        if n_out >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish(
        self, req: Request, detok: Detokenizer | None, status: RequestStatus
    ) -> RequestOutput:
        """End a request without a new token: aborted, its context outgrew the pool, or it
        only scored its prompt (``max_tokens`` 0, "length" once its prefill is done)."""
        req.status = status
        return self.output(req, detok, [], None, finished=True,
                           prompt_logprobs=take_prompt_logprobs(req))

    @staticmethod
    def output(
        req: Request,
        detok: Detokenizer | None,
        new_ids: list[int],
        lp: list[TokenLogprob] | None,
        delta: str = "",
        finished: bool = False,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> RequestOutput:
        """The request's progress: what is new in this step, and everything so far."""
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            new_token_ids=new_ids,
            new_text=delta,
            token_ids=req.output_token_ids,
            text=detok.text if detok is not None else "",
            finished=finished,
            finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason,
            logprobs=lp,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            prompt_logprobs=prompt_logprobs,
        )


def take_prompt_logprobs(req: Request) -> list[TokenLogprob | None] | None:
    """A request's prompt logprobs, once every prompt token is scored; the request owes none
    after its first output either way (the decode role's first output, whose prompt was
    scored on the prefill worker, carries none)."""
    lps, req.prompt_logprobs = req.prompt_logprobs, None
    return lps if lps is not None and len(lps) == req.num_prompt_tokens else None
