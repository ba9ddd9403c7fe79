"""Tool calling for one chat request, between the proto and ``router/tools``.

    ChatMessages.tools_json / tool_choice ──ToolUse.from_chat──> ToolUse (checked)
        ToolUse.constrain(sampling): required / a named tool -> the grammar engine's schema
        ToolUse.output() -> ToolOutput: the request's text deltas in, content deltas out; at the
            end the calls parsed from the output (constrained: the JSON the grammar forced;
            auto: the model family's markup, through its parser)

A chat template that does not render tools gets them described in a system message instead,
in the Hermes format its parser reads (``tools_prompt``), so ``auto`` works on any model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from protos.tandem.v1 import tandem_pb2
from router.errors import InvalidRequestError
from router.tools import (
    PARSERS,
    StreamingToolParser,
    ToolCall,
    ToolChoice,
    ToolParseError,
    ToolParser,
    ToolRequest,
    choice_schema,
    parse_constrained,
    parse_tools,
    parser_for,
    to_template_tools,
)
from router.tools.call import CallDelta, ContentDelta, ToolDelta, collect

_MODES = ("auto", "none", "required")
# Parsers whose markers are special tokens: the text must keep them.
_SPECIAL_MARKERS = frozenset({"mistral", "llama3_json"})


@dataclass(slots=True)
class ToolUse:
    """A chat request's tools, how the model must use them, and how to read its answer."""

    request: ToolRequest
    parser: ToolParser | None  # None: constrained, or no markup this model writes is known

    @classmethod
    def from_chat(
        cls, chat: tandem_pb2.ChatMessages, chat_template: str | None, parser_name: str | None
    ) -> ToolUse | None:
        """The request's tool use (None without tools). Raises InvalidRequestError."""
        if not chat.tools_json:
            if chat.tool_choice not in ("", "none", "auto"):
                raise InvalidRequestError("tool_choice", f"{chat.tool_choice!r} needs tools")
            return None
        try:
            raw = json.loads(chat.tools_json)
        except ValueError as err:
            raise InvalidRequestError("chat.tools_json", f"not JSON: {err}") from None
        tools = parse_tools(raw)
        choice = _choice(chat.tool_choice or "auto", [t.name for t in tools])
        parallel = chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True
        request = ToolRequest(tools, choice, parallel)
        parser = None
        if choice.mode == "auto":
            template = chat_template or ""
            parser = parser_for(parser_name, template if renders_tools(template) else None)
            if parser is None and not renders_tools(template):
                parser = PARSERS["hermes"]  # tools_prompt describes them in its format
        return cls(request, parser)

    @property
    def active(self) -> bool:
        """Whether the output may hold calls (false for ``tool_choice: none``)."""
        return self.request.choice.mode != "none"

    def constrain(self, sampling: tandem_pb2.SamplingParams) -> None:
        """Force the output's shape for required / named choices (the grammar engine's JSON
        Schema); refuses a request that also asked for its own structured output."""
        schema = choice_schema(self.request.tools, self.request.choice,
                               self.request.parallel_tool_calls)
        if schema is None:
            if self.parser is not None and self.parser.name in _SPECIAL_MARKERS:
                sampling.skip_special_tokens = False
            return
        if sampling.structured.WhichOneof("kind") is not None:
            raise InvalidRequestError(
                "tool_choice", f"{self.request.choice.mode!r} cannot be combined with "
                "response_format or another structured output"
            )
        sampling.structured.json_schema = json.dumps(schema, separators=(",", ":"))

    def template_tools(self) -> list[dict[str, object]]:
        """The tools as a chat template's ``tools=`` argument takes them."""
        return to_template_tools(self.request.tools)

    def output(self) -> ToolOutput:
        """A fresh reader for this request's output."""
        stream = self.parser.streaming() if self.parser is not None and self.active else None
        return ToolOutput(self, stream)


@dataclass(slots=True)
class ToolOutput:
    """Turns one request's text deltas into content deltas and, at the end, its calls."""

    use: ToolUse
    stream: StreamingToolParser | None
    _held: list[str] = field(default_factory=list)  # constrained: the whole JSON
    _deltas: list[ToolDelta] = field(default_factory=list)

    def feed(self, text: str) -> str:
        """The content a text delta releases (calls are kept for ``finish``)."""
        if not self.use.active:
            return text
        if self.stream is None:
            self._held.append(text)
            return ""
        return self._content(self.stream.feed(text))

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content still held back, and every call the output made."""
        if not self.use.active:
            return "", []
        if self.stream is None:
            text = "".join(self._held)
            try:
                return "", parse_constrained(text, self.use.request.tools, self.use.request.choice)
            except ToolParseError:  # cut off by max_tokens: the client gets the text
                return text, []
        rest = self._content(self.stream.finish())
        return rest, collect(self._deltas).calls

    def _content(self, deltas: list[ToolDelta]) -> str:
        out = []
        for d in deltas:
            if isinstance(d, ContentDelta):
                out.append(d.content)
            elif isinstance(d, CallDelta):
                self._deltas.append(d)
        return "".join(out)


def renders_tools(template: str) -> bool:
    """Whether a chat template uses the ``tools`` it is given."""
    return "tools" in template


def tools_prompt(tools: list[dict[str, object]]) -> str:
    """A system message describing ``tools`` in the Hermes format, for templates that do not
    render tools themselves."""
    listing = "\n".join(json.dumps(t, separators=(",", ":")) for t in tools)
    return (
        "You may call one or more functions to answer. The functions are:\n<tools>\n"
        f"{listing}\n</tools>\nTo call a function, reply with one block per call:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>'
    )


def _choice(raw: str, names: list[str]) -> ToolChoice:
    if raw in _MODES:
        return ToolChoice(raw)  # type: ignore[arg-type]
    if raw not in names:
        raise InvalidRequestError("tool_choice", f"names no declared tool: {raw!r}")
    return ToolChoice("named", raw)
