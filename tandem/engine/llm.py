"""The offline API: ``LLM(model="smollm2").generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from tandem.engine.config import EngineConfig
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.omp_pools import intra_op_threads
from tandem.engine.outputs import TokenLogprob
from tandem.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class CompletionOutput:
    """One finished generation."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_reason: int | str | None
    num_cached_tokens: int
    logprobs: list[TokenLogprob] | None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when asked (first entry None)


Prompt = str | Sequence[int]
STEP_THREADS = ("adaptive", "fixed")


def _check_step_threads(step_threads: str) -> None:
    if step_threads not in STEP_THREADS:
        raise ValueError(f"step_threads must be one of {STEP_THREADS} (got {step_threads!r})")


class LLM:
    """Batch generation over the continuous-batching engine (all prompts run together).

    ``step_threads``: ``"adaptive"`` (default) runs each fused native CPU step on half or all
    of the engine's threads, whichever measures faster for steps of its size
    (tandem/engine/step_threads.py, as the workers do): on a host where other processes want
    the cores, a team as wide as the core count stalls at every barrier of a step and one
    thread is many times faster. ``"fixed"``: every step on all of them."""

    def __init__(self, model: str = "smollm2", progress: bool = True,
                 step_threads: str = "adaptive", **config: Any) -> None:
        _check_step_threads(step_threads)
        self._attach(LLMEngine(EngineConfig.from_kwargs(model=model, **config), progress),
                     step_threads)

    @classmethod
    def from_config(cls, config: EngineConfig, progress: bool = True,
                    step_threads: str = "adaptive") -> LLM:
        """Build from a full EngineConfig (what the CLI flags produce)."""
        _check_step_threads(step_threads)
        llm = cls.__new__(cls)
        llm._attach(LLMEngine(config, progress), step_threads)
        return llm

    def _attach(self, engine: LLMEngine, step_threads: str) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        if step_threads == "adaptive":
            engine.runner.adapt_threads(intra_op_threads())

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """Generate for every prompt; results come back in prompt order."""
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or a single one for all")
        ids = []
        try:
            for prompt, p in zip(prompts, params, strict=False):
                ids.append(self.engine.add_request(prompt, _copy(p)))
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        done: dict[str, CompletionOutput] = {}
        logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in ids}
        prompt_lps: dict[str, list[TokenLogprob | None]] = {}
        bar = tqdm(total=len(ids), desc="Generating", unit="req", disable=not use_tqdm)
        try:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.logprobs:
                        logprobs[out.request_id].extend(out.logprobs)
                    if out.prompt_logprobs is not None:  # on the request's first output
                        prompt_lps[out.request_id] = out.prompt_logprobs
                    if out.finished:
                        done[out.request_id] = CompletionOutput(
                            prompt_token_ids=out.prompt_token_ids,
                            token_ids=out.token_ids,
                            text=out.text,
                            finish_reason=out.finish_reason or "stop",
                            stop_reason=out.stop_reason,
                            num_cached_tokens=out.num_cached_tokens,
                            logprobs=logprobs[out.request_id] or None,
                            prompt_logprobs=prompt_lps.get(out.request_id),
                        )
                        bar.update(1)
        except BaseException:
            for rid in ids:
                if rid not in done:
                    self.engine.abort(rid)
            raise
        finally:
            bar.close()
        return [done[rid] for rid in ids]


def _copy(p: SamplingParams) -> SamplingParams:
    """Each request gets its own params object (validation may normalize fields)."""
    from dataclasses import replace

    return replace(p, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids))
