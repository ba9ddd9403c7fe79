"""The flags of ``tandem generate`` and ``tandem chat`` that shape what the model writes and
what comes back with it, read and checked here: a bad value is a usage error naming its flag
(exit 2), never a traceback and never a round trip to the router.

    --json-schema FILE|JSON  --json-object  --regex RE  --choice A --choice B  --grammar FILE|EBNF
    --logit-bias TOKEN_ID=BIAS (repeatable)
    --tools FILE|JSON  --tool-choice auto|none|required|NAME
    --logprobs  --top-logprobs N

A FILE|JSON value is JSON when it starts with ``{`` or ``[``, else a file to read (``@FILE``
always reads); a grammar is EBNF text when it holds ``::=``, else a file. ``--tools`` takes
OpenAI's list of tools (``[{"type": "function", "function": {"name": ..., "parameters":
...}}]``), one tool, or bare functions (``{"name": ..., "parameters": ...}``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_BIAS = 100.0  # OpenAI's range for logit_bias values
MAX_TOP_LOGPROBS = 20
_TOOL_MODES = ("auto", "none", "required")


class FlagError(ValueError):
    """A flag's value cannot be used; the message starts with the flag's name."""


def add_structured_args(g: argparse._ArgumentGroup) -> None:
    """The structured-output flags (one at most) and --logit-bias, in the sampling group."""
    s = g.add_mutually_exclusive_group()
    s.add_argument("--json-schema", default=None, metavar="FILE|JSON",
                   help="the output must match this JSON Schema (a file, or its JSON text)")
    s.add_argument("--json-object", action="store_true", default=None,
                   help="the output must be a JSON object")
    s.add_argument("--regex", default=None, help="the output must match this regex")
    s.add_argument("--choice", action="append", default=None,
                   help="the output must be one of these strings (repeatable)")
    s.add_argument("--grammar", default=None, metavar="FILE|EBNF",
                   help="the output must match this EBNF grammar (a file, or its text)")
    g.add_argument("--logit-bias", action="append", default=None, metavar="TOKEN_ID=BIAS",
                   help=f"add BIAS (-{MAX_BIAS:g}..{MAX_BIAS:g}) to a token's logit (repeatable)")


def add_tool_args(p: argparse.ArgumentParser) -> None:
    """--tools and --tool-choice (the request becomes a chat)."""
    g = p.add_argument_group("tools (calls print as JSON lines after the text)")
    g.add_argument("--tools", default=None, metavar="FILE|JSON",
                   help="functions the model may call: OpenAI's tools list (a file, or JSON)")
    g.add_argument("--tool-choice", default=None, metavar="auto|none|required|NAME",
                   help="whether the model may, must or must not call one, or which (a name)")


def add_logprob_args(p: argparse.ArgumentParser) -> None:
    """--logprobs and --top-logprobs."""
    g = p.add_argument_group("logprobs (print as JSON lines after the text)")
    g.add_argument("--logprobs", action="store_true", default=None,
                   help="each generated token's id and logprob")
    g.add_argument("--top-logprobs", type=int, default=None, metavar="N",
                   help=f"and the N (0..{MAX_TOP_LOGPROBS}) likeliest tokens at each step "
                        "(implies --logprobs)")


def structured_option(args: argparse.Namespace) -> dict[str, Any] | None:
    """The one structured-output flag given, as the SDK's ``structured=`` mapping."""
    schema = getattr(args, "json_schema", None)
    if schema is not None:
        text = _json_or_file(schema, "--json-schema")
        if not isinstance(_decode(text, "--json-schema"), dict):
            raise FlagError("--json-schema: a JSON Schema is a JSON object")
        return {"json_schema": text}
    regex = getattr(args, "regex", None)
    if regex is not None:
        if not regex:
            raise FlagError("--regex: empty")
        return {"regex": regex}
    choices = getattr(args, "choice", None)
    if choices is not None:
        return {"choice": list(choices)}
    grammar = getattr(args, "grammar", None)
    if grammar is not None:
        return {"grammar": _text_or_file(grammar, "--grammar", lambda v: "::=" in v)}
    return {"json_object": True} if getattr(args, "json_object", None) else None


def logit_bias_option(args: argparse.Namespace) -> dict[int, float] | None:
    """--logit-bias TOKEN_ID=BIAS values as ``{token id: bias}``."""
    values = getattr(args, "logit_bias", None)
    if not values:
        return None
    out: dict[int, float] = {}
    for value in values:
        token, sep, bias = value.partition("=")
        try:
            token_id, amount = int(token), float(bias)
        except ValueError:
            token_id, amount = -1, math.nan
        if not sep or token_id < 0:
            raise FlagError(f"--logit-bias: expected TOKEN_ID=BIAS (a token id, a number), "
                            f"got {value!r}")
        if not -MAX_BIAS <= amount <= MAX_BIAS:
            raise FlagError(f"--logit-bias: the bias of token {token_id} must be in "
                            f"[-{MAX_BIAS:g}, {MAX_BIAS:g}]")
        if token_id in out:
            raise FlagError(f"--logit-bias: token {token_id} given twice")
        out[token_id] = amount
    return out


def tool_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` for the SDK (empty without --tools)."""
    raw, choice = getattr(args, "tools", None), getattr(args, "tool_choice", None)
    if raw is None:
        if choice is not None:
            raise FlagError("--tool-choice: needs --tools")
        return {}
    tools = _tools(_decode(_json_or_file(raw, "--tools"), "--tools"))
    options: dict[str, Any] = {"tools": tools}
    if choice is not None:
        names = [t["function"]["name"] for t in tools]
        if choice not in _TOOL_MODES and choice not in names:
            raise FlagError(f"--tool-choice: expected one of {', '.join(_TOOL_MODES)} or a "
                            f"tool's name ({', '.join(names)}), got {choice!r}")
        options["tool_choice"] = choice
    return options


def logprob_options(args: argparse.Namespace) -> dict[str, Any]:
    """``logprobs`` and ``top_logprobs`` for the SDK (empty when not asked)."""
    top = getattr(args, "top_logprobs", None)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise FlagError(f"--top-logprobs: must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    if not getattr(args, "logprobs", None) and top is None:
        return {}
    return {"logprobs": True, "top_logprobs": top or 0}


def _tools(value: Any) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise FlagError("--tools: no tools in the list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise FlagError(f"--tools: item {i} is not a JSON object")
        if "function" not in item and "name" in item:  # a bare function
            item = {"type": "function", "function": item}
        function = item.get("function")
        if item.get("type", "function") != "function" or not isinstance(function, dict):
            raise FlagError(f"--tools: item {i} is not a function tool "
                            '({"type": "function", "function": {"name": ...}})')
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise FlagError(f"--tools: item {i} has no function name")
        out.append({**item, "type": "function"})
    return out


def _json_or_file(value: str, flag: str) -> str:
    return _text_or_file(value, flag, lambda v: v.lstrip()[:1] in ("{", "["))


def _text_or_file(value: str, flag: str, inline: Callable[[str], bool]) -> str:
    """``value`` itself when ``inline`` says it is one, else the text of the file it names
    (``@FILE`` always names a file)."""
    if not value.startswith("@") and inline(value):
        return value
    path = Path(value[1:] if value.startswith("@") else value)
    try:
        return path.read_text()
    except OSError as err:
        raise FlagError(f"{flag}: cannot read {str(path)!r}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise FlagError(f"{flag}: {str(path)!r} is not UTF-8 text") from None


def _decode(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise FlagError(f"{flag}: not JSON: {err}") from None
