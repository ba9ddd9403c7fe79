"""Which tool parser reads a model's free-form output: named by the operator, or guessed from
the chat template's text (the markup a template teaches the model is the markup it emits)."""

from __future__ import annotations

from tandem.router.tools.hermes import HermesToolParser
from tandem.router.tools.llama3 import Llama3JsonToolParser
from tandem.router.tools.mistral import MistralToolParser
from tandem.router.tools.parser import ToolParser

# Parsers hold no state (streaming() makes a fresh stream), so one instance serves all.
PARSERS: dict[str, ToolParser] = {
    parser.name: parser
    for parser in (HermesToolParser(), Llama3JsonToolParser(), MistralToolParser())
}

# In order: the first marker found in the template picks the parser.
_TEMPLATE_MARKERS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
)


def parser_for(name: str | None, chat_template: str | None) -> ToolParser | None:
    """The parser called ``name``, or for None/``"auto"`` the one ``chat_template`` implies
    (None when it implies none). Raises ValueError on an unknown name."""
    if name is not None and name != "auto":
        try:
            return PARSERS[name]
        except KeyError:
            choices = ", ".join(["auto", *sorted(PARSERS)])
            raise ValueError(f"unknown tool parser {name!r}; choose one of: {choices}") from None
    if not chat_template:
        return None
    for marker, parser_name in _TEMPLATE_MARKERS:
        if marker in chat_template:
            return PARSERS[parser_name]
    return None
