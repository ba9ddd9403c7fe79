"""What a parsed model output carries: tool calls, their streamed deltas, and their JSON form.

Arguments are kept as a JSON *string*, as OpenAI sends ``function.arguments``; every parser
writes them with ``dump_arguments`` so all formats serialize the same way.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

_ID_ALPHABET = string.ascii_letters + string.digits
_MISSING = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON: a call carrying them would re-serialize into invalid JSON.
# Raw control characters (a newline) inside strings are let through: models write them, and
# dump_arguments escapes them again.
JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant, strict=False)


def dump_arguments(arguments: Any) -> str:
    """``arguments`` as compact JSON text, non-ASCII characters kept as they are."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def decode_at(text: str, i: int) -> tuple[Any, int] | None:
    """The JSON object or array starting at ``text[i]`` and the index just past it; None when
    it is incomplete or invalid.

    Called again and again on a growing buffer, so it stays cheap: such a value ends at a
    closing bracket, so only the text up to the last one is decoded, and that is remembered.
    """
    last = text.rfind("}" if text[i] == "{" else "]")
    if last < i:
        return None
    found = _decode_prefix(text[i : last + 1])
    return None if found is None else (found[0], i + found[1])


@lru_cache(maxsize=64)
def _decode_prefix(text: str) -> tuple[Any, int] | None:
    # Cached values are shared: callers only read them.
    try:
        return JSON_DECODER.raw_decode(text)
    except ValueError:
        return None


def call_from_object(obj: Any, require_arguments: bool = False) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` from a decoded ``{"name": ..., "arguments": {...}}``
    (``"parameters"`` is accepted for ``"arguments"``, and a JSON string holding the object);
    None when ``obj`` is not such a call. Missing (or null) arguments mean ``{}`` unless
    ``require_arguments``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", _MISSING))
    if arguments is _MISSING or arguments is None:
        if require_arguments:
            return None
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = JSON_DECODER.decode(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return obj["name"], dump_arguments(arguments)


def new_call_id() -> str:
    """A fresh OpenAI-style call id: ``call_`` and 24 random letters or digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: ``arguments`` is a JSON object serialized as text."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """The call as an OpenAI ``message.tool_calls`` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A model output split into the text outside the calls (None when empty) and the calls."""

    content: str | None
    calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """A piece of ``delta.content`` while streaming."""

    content: str


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of ``delta.tool_calls[*]`` while streaming.

    The first delta of call ``index`` carries its ``id`` and ``name`` (and ``arguments=""``);
    later ones carry only argument text, which concatenates to the call's ``arguments``.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """The delta as an OpenAI ``delta.tool_calls`` item."""
        function: dict[str, Any] = {"arguments": self.arguments}
        out: dict[str, Any] = {"index": self.index, "function": function}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        return out


ToolDelta = ContentDelta | CallDelta


def collect(deltas: Iterable[ToolDelta]) -> ParsedOutput:
    """Fold streamed deltas back into the output they describe (what a client reassembles)."""
    content: list[str] = []
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            content.append(delta.content)
            continue
        if delta.id is not None:
            ids[delta.index] = delta.id
        if delta.name is not None:
            names[delta.index] = delta.name
        arguments.setdefault(delta.index, []).append(delta.arguments)
    calls = [
        ToolCall(ids.get(i, ""), names.get(i, ""), "".join(arguments[i])) for i in sorted(arguments)
    ]
    return ParsedOutput("".join(content) or None, calls)
