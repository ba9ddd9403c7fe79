"""Complexity limits on a structured output's grammar, checked before any worker compiles it.

A grammar's compile time is not bounded by its size: a 57 KB JSON Schema of 2,000 optional
string properties takes 14-27 s of CPU to compile against a 49k-token vocabulary (an object's
optional properties cost about quadratically), while 2,000 required ones take 0.3 s. These
limits refuse, for free and at the router, the shapes that make compiles slow; whatever passes
them is still held to the workers' compile budget (tandem/engine/structured/compile_pool.py).

    json_schema  properties per object (``properties`` and ``patternProperties``), schema nodes
                 (every JSON object and array in the document), values per ``enum``, branches
                 per ``anyOf``/``oneOf``/``allOf``, nesting depth (objects and arrays), the
                 length of each regex (``pattern``, ``patternProperties`` keys)
    regex        its length
    grammar      its rule count (every ``::=``)
    choice       count and characters (tandem/router/validation.py)

The defaults, measured with SmolLM2's 49k vocabulary on one CPU core: 256 optional properties
in one object compile in 0.13 s, 16 such objects (4,100 nodes) in ~7 s, 256 objects of 16
(4,600 nodes) in 1.8 s; 1,024 enum values, 128 anyOf branches, 64 levels of nesting, a
4,096-character regex or 1,024 EBNF rules each in under 0.2 s. 4,096 nodes leave room for a
forced call among 128 tools (OpenAI's limit) of a dozen parameters each. OpenAI's own limits on strict schemas are of the same order (5,000 properties in all,
1,000 enum values, 10 levels). The JSON walk is iterative and stops at the first limit passed,
so checking costs at most ``max_schema_nodes`` steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tandem.router.api.sampling import StructuredOutput
from tandem.router.errors import InvalidRequestError

_BRANCHES = ("anyOf", "oneOf", "allOf")
_PATH_KEY_CHARS = 32  # a key's characters shown in an error's path (keys may be hostile)


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """Bounds on one structured output's grammar (the router's ``--grammar-max-*`` flags)."""

    max_properties: int = 256
    max_schema_nodes: int = 4096
    max_enum: int = 1024
    max_branches: int = 128
    max_depth: int = 64
    max_regex_chars: int = 4096
    max_rules: int = 1024

    def __post_init__(self) -> None:
        bad = [name for name in self.__slots__ if getattr(self, name) < 1]
        if bad:
            raise ValueError(f"grammar limits must be >= 1: {', '.join(bad)}")


DEFAULT_GRAMMAR_LIMITS = GrammarLimits()


def check_grammar(so: StructuredOutput, limits: GrammarLimits = DEFAULT_GRAMMAR_LIMITS) -> None:
    """Raise InvalidRequestError naming the first limit ``so`` passes (and the router flag that
    sets it)."""
    field = f"structured_outputs.{so.kind}"
    if so.kind == "regex" and isinstance(so.value, str):
        _at_most(len(so.value), limits.max_regex_chars, field, "characters in the regex", "",
                 "--grammar-max-regex-chars")
    elif so.kind == "grammar" and isinstance(so.value, str):
        _at_most(so.value.count("::="), limits.max_rules, field, "rules in the grammar", "",
                 "--grammar-max-rules")
    elif so.kind == "json_schema" and isinstance(so.value, str):
        try:
            schema = json.loads(so.value)
        except RecursionError:  # nested past the parser's own stack
            raise InvalidRequestError(
                field, f"nested deeper than {limits.max_depth} levels "
                "(the router's --grammar-max-depth)") from None
        except ValueError as err:
            raise InvalidRequestError(field, f"not JSON: {err}") from None
        _check_schema(schema, limits, field)


def _check_schema(schema: Any, limits: GrammarLimits, field: str) -> None:
    # (node, depth, trail): trail is (key, parent trail), a path built only for an error
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(schema, 1, None)]
    nodes = 0
    while stack:
        node, depth, trail = stack.pop()
        if isinstance(node, dict):
            children: Any = node.items()
            _check_keywords(node, limits, field, trail)
        elif isinstance(node, list):
            children = enumerate(node)
        else:
            continue
        nodes += 1
        _at_most(nodes, limits.max_schema_nodes, field, "schema nodes (objects and arrays)",
                 "", "--grammar-max-schema-nodes")
        _at_most(depth, limits.max_depth, field, "levels of nesting", _path(trail),
                 "--grammar-max-depth")
        for key, child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, (key, trail)))


def _check_keywords(node: dict[str, Any], limits: GrammarLimits, field: str,
                    trail: tuple[Any, ...] | None) -> None:
    """The limits on one schema object's keywords (a property merely named like a keyword
    is counted too: the count can only be higher, never lower, than the schema's)."""
    count = 0
    for name in ("properties", "patternProperties"):
        value = node.get(name)
        if isinstance(value, dict):
            count += len(value)
    _at_most(count, limits.max_properties, field, "properties in one object", _path(trail),
             "--grammar-max-properties")
    enum = node.get("enum")
    if isinstance(enum, list):
        _at_most(len(enum), limits.max_enum, field, "enum values", _path(trail),
                 "--grammar-max-enum")
    for name in _BRANCHES:
        value = node.get(name)
        if isinstance(value, list):
            _at_most(len(value), limits.max_branches, field, f"{name} branches", _path(trail),
                     "--grammar-max-branches")
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    if isinstance(node.get("patternProperties"), dict):
        patterns += list(node["patternProperties"])
    for pattern in patterns:
        _at_most(len(pattern), limits.max_regex_chars, field, "characters in a pattern",
                 _path(trail), "--grammar-max-regex-chars")


def _at_most(count: int, limit: int, field: str, what: str, where: str, flag: str) -> None:
    if count <= limit:
        return
    # counters that stop at the first one over say "more than"; a length is said exactly
    amount = f"more than {limit}" if count == limit + 1 else str(count)
    at = f" at {where}" if where else ""
    raise InvalidRequestError(
        field, f"{amount} {what}{at}; the limit is {limit} (the router's {flag})")


def _path(trail: tuple[Any, ...] | None) -> str:
    """A JSON Pointer to the node (``/`` for the root), each key cut short."""
    keys: list[str] = []
    while trail is not None:
        key, trail = trail
        text = str(key)
        keys.append(text if len(text) <= _PATH_KEY_CHARS else text[:_PATH_KEY_CHARS] + "...")
    return "/" + "/".join(reversed(keys))
