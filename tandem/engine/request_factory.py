"""From a prompt and its sampling params to the engine's state for one request, or a refusal.

    prompt (text | token ids) ──tokenize, check vocabulary──> token ids
    token ids + params ──check context, pool, stop strings──> Request (tandem/engine/core)
                       ──seeded generator, detokenizer, grammar matcher──> LiveRequest

A resumed request (``prior`` > 0: the last ``prior`` tokens were generated on an earlier leg)
is shaped like one preempted after generating them: its KV is recomputed, max/min tokens,
penalties and stop strings count them as output, a seeded RNG skips their draws and a
grammar matcher (structured outputs) replays them.

A forked request (``n`` > 1) is built as sequence 0; ``fork`` builds sequence j from it when
its prompt is computed: the same prompt and progress, its own RNG (seed + j), detokenizer and
grammar matcher, no prompt logprobs (sequence 0 carries them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tandem.common.wire import MAX_SEQUENCES
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus, fork_seed, sequence_id
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.errors import InvalidRequestError
from tandem.engine.lora.manager import LoraManager
from tandem.engine.sampler import SamplingState, skip_draw
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.structured.constraint import Constraint
from tandem.engine.structured.grammar_engine import GrammarEngine


@dataclass(slots=True)
class LiveRequest:
    """Per-request state the engine keeps beside the scheduler's Request."""

    request: Request
    sampling: SamplingState
    detok: IncrementalDetokenizer | None


class RequestFactory:
    """Validates requests against one model and cache, and builds their ``LiveRequest``."""

    def __init__(
        self,
        tokenizer: Any,  # PreTrainedTokenizerBase | None
        vocab_size: int,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        kv: KVCacheManager,
        grammars: GrammarEngine | None = None,
        loras: LoraManager | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.kv = kv
        self.grammars = grammars
        self.loras = loras  # None: LoRA is off, a request naming an adapter is refused

    def build(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams,
        hold_kv: bool = False,
        prior: int = 0,
        n: int = 1,
    ) -> LiveRequest:
        """A new request (see the module docstring for ``prior`` and ``n``). Raises
        InvalidRequestError."""
        params.validate(self.vocab_size)
        token_ids = self.tokenize(prompt)
        if isinstance(prior, bool) or not 0 <= prior < len(token_ids):
            raise InvalidRequestError(
                "prior_output_tokens", f"{prior!r} must be in [0, {len(token_ids)})"
            )
        _check_n(n, prior, params)
        if len(token_ids) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt", f"{len(token_ids)} tokens leave no room in the context of "
                f"{self.max_model_len} tokens",
            )
        if self.kv.blocks_needed(len(token_ids) + 1) > self.kv.pool.num_blocks:
            raise InvalidRequestError("prompt", "longer than the whole KV cache can hold")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")
        n_prompt = len(token_ids) - prior
        req = Request(request_id, token_ids[:n_prompt], params, hold_kv=hold_kv,
                      all_token_ids=list(token_ids), num_forks=n,
                      cache_salt=self._lora_salt(params.lora))
        live = self._live(req)
        for _ in range(prior):
            skip_draw(live.sampling)
        if params.structured is not None:
            live.sampling.constraint = self._constraint(params, token_ids[n_prompt:])
        if live.detok is not None:
            for t in token_ids[n_prompt:]:  # already streamed by the earlier leg
                live.detok.add(t)
        return live

    def fork(self, parent: Request, index: int) -> LiveRequest:
        """Sequence ``index`` of a forked request whose prompt is computed: the parent's
        prompt and progress (its blocks are the KV cache manager's to share), seed + index,
        a fresh detokenizer and grammar matcher; nothing generated yet."""
        params = dataclasses.replace(parent.params, seed=fork_seed(parent.params.seed, index))
        req = Request(
            sequence_id(parent.request_id, index), parent.prompt_token_ids, params,
            arrival_time=parent.arrival_time, all_token_ids=list(parent.all_token_ids),
            num_computed_tokens=parent.num_computed_tokens,
            num_cached_tokens=parent.num_cached_tokens, status=RequestStatus.RUNNING,
            cache_salt=parent.cache_salt,
        )
        req.prompt_logprobs = None  # sequence 0's first output carries them
        live = self._live(req)
        if params.structured is not None:
            live.sampling.constraint = self._constraint(params, ())
        return live

    def _lora_salt(self, name: str) -> int | None:
        """The prefix-cache salt of a request under adapter ``name``; an adapter this
        engine does not hold (or any, with LoRA off) is refused."""
        if not isinstance(name, str):
            raise InvalidRequestError("lora", "must be a string")
        if not name:
            return None
        if self.loras is None:
            raise InvalidRequestError("lora", f"LoRA is not enabled here (adapter {name!r})")
        return self.loras.salt(name)

    def _live(self, req: Request) -> LiveRequest:
        """The sampler's state and the detokenizer of a new request."""
        params = req.params
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        sampling = SamplingState(
            params, req.prompt_token_ids, req.output_token_ids, gen, self.eos_token_ids
        )
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, params)
        return LiveRequest(req, sampling, detok)

    def _constraint(self, params: SamplingParams, prior_tokens: Sequence[int]) -> Constraint:
        """The request's grammar matcher, past the tokens an earlier leg generated."""
        assert params.structured is not None
        if self.grammars is None:
            raise InvalidRequestError("structured_outputs", "structured outputs need a tokenizer")
        constraint = self.grammars.constraint(params.structured)
        for t in prior_tokens:
            if not constraint.accept(t):
                raise InvalidRequestError(
                    "prior_output_tokens", "the earlier leg's tokens do not match the grammar"
                )
        return constraint

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt; ids given directly must lie in the vocabulary."""
        vocab = self.vocab_size
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "this model has no tokenizer: send token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        else:
            ids = list(prompt)
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    raise InvalidRequestError(
                        "prompt", f"token id {t!r} is outside the vocabulary [0, {vocab})"
                    )
        if not ids:
            raise InvalidRequestError("prompt", "must not be empty")
        return ids


def _check_n(n: int, prior: int, params: SamplingParams) -> None:
    """A forked request's ``n``: 1..MAX_SEQUENCES, for a fresh prompt that generates."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEQUENCES:
        raise InvalidRequestError("n", f"{n!r} must be in [1, {MAX_SEQUENCES}]")
    if n > 1 and prior:
        raise InvalidRequestError("n", "a resumed request (prior_output_tokens) is one sequence")
    if n > 1 and params.max_tokens == 0:
        raise InvalidRequestError("n", "a request that only scores its prompt is one sequence")
