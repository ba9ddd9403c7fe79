"""A chat prompt: its messages and the tools the reply may call."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.router.tools.call import ToolCall

TemplateValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation (role: system | user | assistant | tool)."""

    role: str
    content: str = ""
    name: str = ""  # a tool message's function name
    tool_call_id: str = ""  # a tool message: the call it answers
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message: the calls it made


@dataclass(frozen=True, slots=True)
class Chat:
    """Messages rendered through the model's chat template.

    ``tools_json``: OpenAI's ``tools`` as a JSON list of {"type": "function", "function":
    {...}} ("" for none); ``tool_choice``: auto (the default with tools) | none | required |
    a tool's name (tandem/router/tool_use.py reads both).
    """

    messages: tuple[ChatMessage, ...]
    add_generation_prompt: bool = True  # the reply is the model's turn
    tools_json: str = ""
    tool_choice: str = ""
    parallel_tool_calls: bool = True
    # Extra variables the chat template sees (vLLM's chat_template_kwargs, e.g.
    # ("enable_thinking", False)); names and values checked at the edge.
    template_kwargs: tuple[tuple[str, TemplateValue], ...] = ()
