"""A structured output under a reasoning parser: the grammar constrains the answer alone.

    the output starts in (or may open) the thinking, and the parser's end marker is one token
        -> StructuredOutput.after_token = that token: the thinking is free, the grammar
           constrains what follows it (the worker's Constraint opens there:
           tandem/engine/structured/constraint.py; vLLM's structured output after reasoning)
    the prompt closed the thinking (``enable_thinking: false``)
        -> the grammar from the first token: the whole output is answer
    the end marker is no single token of the tokenizer
        -> the grammar from the first token, as without a parser (a token-level gate needs
           one token to open at; Qwen3's and DeepSeek-R1's ``</think>`` are one token each)

An output that never ends its thinking is never constrained (it is all reasoning, as the
parser reads it); ``max_tokens`` bounds it.
"""

from __future__ import annotations

from dataclasses import replace

from tokenizers import Tokenizer

from tandem.router.api.sampling import SamplingSpec
from tandem.router.reasoning import ReasoningParser


def defer_grammar(parser: ReasoningParser, vocab: Tokenizer, prompt_tail: str,
                  sampling: SamplingSpec) -> SamplingSpec:
    """``sampling`` with its structured output deferred past the end of the thinking when the
    output of a prompt ending with ``prompt_tail`` may think (see the module docstring); as
    given otherwise, and when the client named its own ``after_token``."""
    so = sampling.structured
    if so is None or so.after_token is not None or parser.stream(prompt_tail).answering:
        return sampling
    end = vocab.token_to_id(parser.end)
    if end is None:
        return sampling
    return replace(sampling, structured=replace(so, after_token=end))


def grammar_from_start(sampling: SamplingSpec) -> bool:
    """Whether a grammar writes the whole output (none of it is thinking)."""
    return sampling.structured is not None and sampling.structured.after_token is None
