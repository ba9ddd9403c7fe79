"""What a request's output must match, as the client asked it (no torch, no xgrammar).

The five shapes are OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's
structured outputs (``regex``, ``choice``, ``grammar``: EBNF as xgrammar reads it). Sizes are
bounded here so a hostile schema costs its sender a 400, not the worker's memory.

``after_token`` defers the grammar for a reasoning model (vLLM's structured output after
reasoning ends): the output is free up to and including that token's first occurrence (its
end-of-thinking token), the grammar constrains what follows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from tandem.engine.errors import InvalidRequestError

Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
KINDS: tuple[Kind, ...] = ("json_object", "json_schema", "regex", "choice", "grammar")

MAX_SPEC_CHARS = 64 * 1024  # a schema, regex or grammar
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """One constraint. ``value``: the schema's JSON text, the regex, the grammar, or the
    choices (a tuple); empty for ``json_object``. ``after_token``: the grammar starts after
    this token's first occurrence in the output (None: from the first token). Hashable; the
    compile cache keys on ``kind`` and ``value`` alone (tandem/engine/structured/grammar_engine.py)."""

    kind: Kind
    value: str | tuple[str, ...] = ""
    after_token: int | None = None

    def validate(self) -> None:
        """Raise InvalidRequestError naming what is wrong (sizes, types, schema syntax)."""
        field = "structured_outputs"
        if self.after_token is not None and (
                isinstance(self.after_token, bool) or not isinstance(self.after_token, int)
                or self.after_token < 0):
            raise InvalidRequestError(f"{field}.after_token", "must be a token id")
        if self.kind not in KINDS:
            raise InvalidRequestError(field, f"unknown kind {self.kind!r}; one of {KINDS}")
        if self.kind == "choice":
            if not isinstance(self.value, tuple) or not self.value:
                raise InvalidRequestError(f"{field}.choice", "must be a non-empty list of strings")
            if len(self.value) > MAX_CHOICES:
                raise InvalidRequestError(f"{field}.choice", f"at most {MAX_CHOICES} choices")
            for c in self.value:
                if not isinstance(c, str) or not c or len(c) > MAX_CHOICE_CHARS:
                    raise InvalidRequestError(
                        f"{field}.choice", f"choices are non-empty strings of at most "
                        f"{MAX_CHOICE_CHARS} characters"
                    )
            return
        if not isinstance(self.value, str):
            raise InvalidRequestError(f"{field}.{self.kind}", "must be a string")
        if len(self.value) > MAX_SPEC_CHARS:
            raise InvalidRequestError(
                f"{field}.{self.kind}", f"{len(self.value)} characters; at most {MAX_SPEC_CHARS}"
            )
        if self.kind == "json_object":
            return
        if not self.value:
            raise InvalidRequestError(f"{field}.{self.kind}", "must not be empty")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.value)
            except RecursionError:
                raise InvalidRequestError(f"{field}.json_schema", "nested too deeply") from None
            except ValueError as err:
                raise InvalidRequestError(f"{field}.json_schema", f"not JSON: {err}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(f"{field}.json_schema", "must be a JSON object")

    def describe(self) -> str:
        """A short label for logs and errors (never the whole schema)."""
        if self.kind == "choice":
            return f"choice of {len(self.value)}"
        return self.kind if self.kind == "json_object" else f"{self.kind} ({len(self.value)} chars)"
