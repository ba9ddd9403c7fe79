"""Compiles a ``StructuredOutput`` for one model's tokenizer and hands out ``Constraint``s.

    GrammarEngine(tokenizer, vocab_size, stop ids, budget) ──prepare(spec)──> compiled, cached
        (a server awaits it before the request reaches the engine thread)
                                                          ──constraint(spec)──> Constraint
        (the engine thread: a cache lookup once prepared)

Each spec is compiled once per engine, keyed by a hash of it (``spec_key``): compiled grammars
are kept (bounded in bytes), and so are refusals (a grammar that does not compile, or whose
compile ran past the CPU budget), so a repeat costs a dictionary lookup either way.
``prepare`` compiles in the bounded pool (compile_pool.py: one compile at a time on a niced
thread, each within ``budget_s`` CPU seconds) and waits at most ``wait_s`` for it; a grammar
still queued or compiling when the wait ends raises GrammarBusyError (nothing is cached: the
compile goes on, and a retry finds it done). ``compile`` (an offline engine, or a grammar
evicted since it was prepared) compiles inline on the caller's thread, with no budget.

The vocabulary table (xgrammar's TokenizerInfo, ~0.2 s for a 49k vocabulary) is built on the
first use, not at start-up, and outside any compile's budget.

JSON (``json_object`` too) is generated without free whitespace (``any_whitespace=False``):
a small model allowed unbounded whitespace can spend its whole budget on it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

import xgrammar as xgr

from tandem.engine.config import GRAMMAR_COMPILE_BUDGET_S
from tandem.engine.errors import GrammarBusyError, InvalidRequestError
from tandem.engine.structured.compile_pool import CompileOverBudget, CompilePool, CompilerBusy
from tandem.engine.structured.constraint import Constraint
from tandem.engine.structured.spec import StructuredOutput

CACHE_LIMIT_BYTES = 256 * 1024 * 1024
MAX_REFUSALS = 4096  # refused specs remembered (a hash and a short reason each)


class GrammarEngine:
    """Grammar compilation and matchers for one tokenizer and vocabulary.

    ``budget_s``: CPU seconds one grammar may take to compile before it is refused (a
    refusal is remembered); ``wait_s`` (default ``budget_s`` plus a second): how long
    ``prepare`` waits for a compile, so a caller's deadline holds however busy the pool is.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int],
                 budget_s: float = GRAMMAR_COMPILE_BUDGET_S, wait_s: float | None = None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._lock = threading.Lock()  # the compiler's creation, the caches
        self.budget_s = budget_s
        self.wait_s = budget_s + 1.0 if wait_s is None else wait_s
        self.pool = CompilePool(budget_s)
        self._compiled: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._compiled_bytes = 0
        self._refused: OrderedDict[str, str] = OrderedDict()  # key -> reason

    def _get_compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop or None
                )
                # no cache of xgrammar's own: ours (by spec hash) remembers refusals too
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    async def prepare(self, spec: StructuredOutput) -> None:
        """Compile ``spec`` (or find it compiled) without blocking the event loop. Raises
        InvalidRequestError when it does not compile or ran past the budget (now or before),
        GrammarBusyError when the pool is full or the compile is not done within ``wait_s``."""
        spec.validate()
        key = spec_key(spec)
        if self._cached(spec, key) is not None:
            return
        if self._compiler is None:  # the vocabulary table: not part of any grammar's budget
            await asyncio.get_running_loop().run_in_executor(None, self._get_compiler)
        try:
            future: Future[xgr.CompiledGrammar] = self.pool.submit(
                key, lambda: self._compile_and_keep(spec, key))
        except CompilerBusy as exc:
            raise GrammarBusyError(f"grammar compiler busy: {exc}") from None
        # whoever waits (or nobody: a timed-out caller), a compile past its budget is refused
        future.add_done_callback(lambda f: self._note_overrun(f, key))
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.wait_s)
        except TimeoutError:
            raise GrammarBusyError(
                f"grammar not compiled within {self.wait_s:g} s (the compiler is busy); "
                "retry later") from None
        except CompileOverBudget as exc:
            raise InvalidRequestError(_field(spec), _over(exc)) from None

    def _note_overrun(self, future: Future[xgr.CompiledGrammar], key: str) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if isinstance(exc, CompileOverBudget):
            self._refuse(key, _over(exc))

    def compile(self, spec: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec``, from the cache or compiled inline now. Raises
        InvalidRequestError when the schema, regex or grammar does not compile (xgrammar's
        reason) or was refused before."""
        spec.validate()
        key = spec_key(spec)
        compiled = self._cached(spec, key)
        return compiled if compiled is not None else self._compile_and_keep(spec, key)

    def _cached(self, spec: StructuredOutput, key: str) -> xgr.CompiledGrammar | None:
        """The compiled grammar of ``key`` if kept; raises InvalidRequestError if refused."""
        with self._lock:
            reason = self._refused.get(key)
            if reason is not None:
                raise InvalidRequestError(_field(spec), reason)
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
            return compiled

    def _compile_and_keep(self, spec: StructuredOutput, key: str) -> xgr.CompiledGrammar:
        try:
            compiled = self._compile_now(spec)
        except InvalidRequestError as exc:
            self._refuse(key, exc.message)
            raise
        with self._lock:
            if key in self._refused:  # ran past its budget meanwhile: the refusal stands
                raise InvalidRequestError(_field(spec), self._refused[key])
            if key not in self._compiled:
                self._compiled[key] = compiled
                self._compiled_bytes += int(compiled.memory_size_bytes)
            while self._compiled_bytes > CACHE_LIMIT_BYTES and len(self._compiled) > 1:
                _, old = self._compiled.popitem(last=False)
                self._compiled_bytes -= int(old.memory_size_bytes)
        return compiled

    def _compile_now(self, spec: StructuredOutput) -> xgr.CompiledGrammar:
        compiler = self._get_compiler()
        try:
            if spec.kind == "json_object":  # any object, without free whitespace
                return compiler.compile_grammar(json_schema_grammar('{"type": "object"}'))
            if spec.kind == "json_schema":
                return compiler.compile_grammar(json_schema_grammar(spec.value))  # type: ignore[arg-type]
            if spec.kind == "regex":
                return compiler.compile_regex(spec.value)  # type: ignore[arg-type]
            if spec.kind == "choice":
                return compiler.compile_grammar(choice_grammar(spec.value))  # type: ignore[arg-type]
            return compiler.compile_grammar(spec.value)  # type: ignore[arg-type]
        except (RuntimeError, ValueError, TypeError) as err:
            reason = _reason(err)
            raise InvalidRequestError(_field(spec), f"does not compile: {reason[:300]}") from None

    def _refuse(self, key: str, reason: str) -> str:
        with self._lock:
            self._refused[key] = reason
            self._refused.move_to_end(key)
            dropped = self._compiled.pop(key, None)  # finished just as it was refused
            if dropped is not None:
                self._compiled_bytes -= int(dropped.memory_size_bytes)
            while len(self._refused) > MAX_REFUSALS:
                self._refused.popitem(last=False)
        return reason

    @property
    def cache_bytes(self) -> int:
        """Bytes of compiled grammars held in the cache."""
        with self._lock:
            return self._compiled_bytes

    def constraint(self, spec: StructuredOutput) -> Constraint:
        """A fresh matcher for one request (deferred past ``spec.after_token`` when set)."""
        return Constraint(self.compile(spec), spec.describe(), spec.after_token)

    def close(self) -> None:
        """Stop taking compiles (one running finishes on its own thread)."""
        self.pool.close()


def spec_key(spec: StructuredOutput) -> str:
    """A hash naming ``spec``: the caches' key."""
    value = json.dumps(list(spec.value)) if isinstance(spec.value, tuple) else str(spec.value)
    return hashlib.sha256(f"{spec.kind}\0{value}".encode()).hexdigest()


def _field(spec: StructuredOutput) -> str:
    return f"structured_outputs.{spec.kind}"


def _over(exc: CompileOverBudget) -> str:
    return f"refused: its grammar {exc} (simplify it: fewer optional properties, " \
           "alternatives or nesting)"


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
