"""Compiles a ``StructuredOutput`` for one model's tokenizer and hands out ``Constraint``s.

    GrammarEngine(tokenizer, vocab_size, stop ids) ──compile(spec)──> xgrammar CompiledGrammar
                                                   ──constraint(spec)──> Constraint

The vocabulary table (xgrammar's TokenizerInfo, ~0.2 s for a 49k vocabulary) is built on the
first use, not at start-up. Compiled grammars are cached by spec (xgrammar's cache, bounded
in bytes); ``compile`` is thread-safe, so servers call it from a worker thread before the
request reaches the engine thread, and the engine's own call then hits the cache.

JSON (``json_object`` too) is generated without free whitespace (``any_whitespace=False``):
a small model allowed unbounded whitespace can spend its whole budget on it.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import xgrammar as xgr

from tandem.engine.errors import InvalidRequestError
from tandem.engine.structured.constraint import Constraint
from tandem.engine.structured.spec import StructuredOutput

CACHE_LIMIT_BYTES = 256 * 1024 * 1024


class GrammarEngine:
    """Grammar compilation and matchers for one tokenizer and vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._lock = threading.Lock()

    def _get_compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop or None
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=1, cache_limit_bytes=CACHE_LIMIT_BYTES
                )
            return self._compiler

    def compile(self, spec: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec`` (cached). Raises InvalidRequestError when the
        schema, regex or grammar does not compile, with xgrammar's reason."""
        spec.validate()
        compiler = self._get_compiler()
        field = f"structured_outputs.{spec.kind}"
        try:
            if spec.kind == "json_object":  # any object, without free whitespace
                return compiler.compile_grammar(json_schema_grammar('{"type": "object"}'))
            if spec.kind == "json_schema":
                return compiler.compile_grammar(json_schema_grammar(spec.value))
            if spec.kind == "regex":
                return compiler.compile_regex(spec.value)
            if spec.kind == "choice":
                return compiler.compile_grammar(choice_grammar(spec.value))  # type: ignore[arg-type]
            return compiler.compile_grammar(spec.value)  # type: ignore[arg-type]
        except (RuntimeError, ValueError, TypeError) as err:
            reason = _reason(err)
            raise InvalidRequestError(field, f"does not compile: {reason[:300]}") from None

    @property
    def cache_bytes(self) -> int:
        """Bytes of compiled grammars held in the cache."""
        return int(self._get_compiler().get_cache_size_bytes())

    def constraint(self, spec: StructuredOutput) -> Constraint:
        """A fresh matcher for one request."""
        return Constraint(self.compile(spec), spec.describe())


def _reason(err: Exception) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    lines = str(err).strip().splitlines()
    text = lines[-1] if lines else type(err).__name__
    return _LOCATION.sub("", text)


_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def json_schema_grammar(schema: str) -> str:
    """xgrammar's EBNF for a JSON Schema, with the characters of length-bounded strings
    (``maxLength``/``minLength``) made JSON's: xgrammar 0.2 lets raw control characters
    U+0000-U+001F into them (RFC 8259 forbids them unescaped; strict parsers reject it)."""
    text = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    return text.replace(_LOOSE_CHARS, _JSON_CHARS)


_LOOSE_CHARS = r'[^\"\\\r\n]'
_JSON_CHARS = r'[^\0-\x1f\"\\]'


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar matching exactly one of ``choices``."""
    return "root ::= " + " | ".join(_literal(c) for c in choices)


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal (JSON's escapes are a subset xgrammar reads)."""
    return json.dumps(text, ensure_ascii=True)
