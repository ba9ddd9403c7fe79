"""Tool calling for one chat request, between the request and ``tandem/router/tools``.

    Chat.tools_json / tool_choice ──ToolUse.from_chat──> ToolUse (checked)
        ToolUse.constrain(sampling) -> the sampling to use: required / a named tool -> the
            grammar engine's schema
        ToolUse.output() -> ToolOutput: the request's text deltas in; content and call deltas
            out as the output settles them (a call's name as soon as it is read, then its
            arguments as they are written); at the end the whole calls (constrained: the JSON
            the grammar forced; auto: the model family's markup, through its parser)

A chat template that does not render tools gets them described in a system message instead,
in the Hermes format its parser reads (``tools_prompt``), so ``auto`` works on any model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from tandem.router.api.chat import Chat
from tandem.router.api.sampling import SamplingSpec, StructuredOutput
from tandem.router.errors import InvalidRequestError
from tandem.router.tools import (
    PARSERS,
    ConstrainedStream,
    StreamingToolParser,
    ToolCall,
    ToolChoice,
    ToolParser,
    ToolRequest,
    choice_schema,
    parse_tools,
    parser_for,
    to_template_tools,
)
from tandem.router.tools.call import CallDelta, ContentDelta, ToolDelta, collect

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
        cls, chat: Chat, chat_template: str | None, parser_name: str | None
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
        request = ToolRequest(tools, choice, chat.parallel_tool_calls)
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

    def constrain(self, sampling: SamplingSpec) -> SamplingSpec:
        """``sampling`` with the output's shape forced for required / named choices (the
        grammar engine's JSON Schema), and special tokens kept for parsers whose markers are
        special tokens; refuses a request that also asked for its own structured output."""
        schema = choice_schema(self.request.tools, self.request.choice,
                               self.request.parallel_tool_calls)
        if schema is None:
            if self.parser is not None and self.parser.name in _SPECIAL_MARKERS:
                return replace(sampling, skip_special_tokens=False)
            return sampling
        if sampling.structured is not None:
            raise InvalidRequestError(
                "tool_choice", f"{self.request.choice.mode!r} cannot be combined with "
                "response_format or another structured output"
            )
        return replace(sampling, structured=StructuredOutput(
            "json_schema", json.dumps(schema, separators=(",", ":"))))

    def template_tools(self) -> list[dict[str, object]]:
        """The tools as a chat template's ``tools=`` argument takes them."""
        return to_template_tools(self.request.tools)

    def output(self) -> ToolOutput:
        """A fresh reader for this request's output."""
        request = self.request
        stream: StreamingToolParser | None = None
        if request.choice.constrained:
            stream = ConstrainedStream(request.tools, request.choice)
        elif self.parser is not None and self.active:
            stream = self.parser.streaming()
        return ToolOutput(stream, request.parallel_tool_calls)


@dataclass(slots=True)
class ToolOutput:
    """Turns one request's text deltas into content and call deltas; at the end, its calls.

    ``stream`` None: the text is all content (``tool_choice: none``, or a model whose call
    markup is unknown). Without ``parallel`` calls after the first are dropped (OpenAI's
    ``parallel_tool_calls: false``, and the legacy ``functions``: one call at most).
    """

    stream: StreamingToolParser | None
    parallel: bool = True
    _calls: list[CallDelta] = field(default_factory=list)  # every call delta sent

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """The content and the call pieces a text delta settles."""
        if self.stream is None:
            return text, []
        return self._split(self.stream.feed(text))

    def finish(self) -> tuple[str, list[CallDelta], list[ToolCall]]:
        """The content and call pieces still held back, and every call the output made."""
        if self.stream is None:
            return "", [], []
        content, calls = self._split(self.stream.finish())
        return content, calls, collect(self._calls).calls

    def _split(self, deltas: list[ToolDelta]) -> tuple[str, list[CallDelta]]:
        content: list[str] = []
        calls: list[CallDelta] = []
        for d in deltas:
            if isinstance(d, ContentDelta):
                content.append(d.content)
            elif self.parallel or d.index == 0:
                calls.append(d)
        self._calls += calls
        return "".join(content), calls


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
