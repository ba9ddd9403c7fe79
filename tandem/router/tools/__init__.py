"""OpenAI tool calling, router side: pure Python, no model or tokenizer in sight.

A request's life::

    body.tools / tool_choice --spec.parse_request_tools--> ToolRequest(tools, choice, ...)
        |-- spec.to_template_tools(tools) --> chat template's tools=      (the prompt)
        '-- constrained.choice_schema(...) --> JSON Schema | None        (the grammar engine)
    output text, piece by piece
        |-- choice required/named: constrained.ConstrainedStream ---------> deltas
        '-- choice auto: select.parser_for(...).streaming() (.parse) -----> deltas (ParsedOutput)
    --> content deltas, call deltas as calls are written (a call's id and name once its name is
        read, then its arguments in pieces: json_stream), and at the end the whole calls

Files:

- ``spec.py``: ``tools``/``functions``/``tool_choice``/``function_call`` checked into
  ToolSpec, ToolChoice and ToolRequest; ``to_template_tools``.
- ``call.py``: ToolCall, ParsedOutput, the streamed ContentDelta/CallDelta, call ids, and
  the JSON reading and writing every parser shares.
- ``constrained.py``: the schema forced calls must match, and reading them back as written.
- ``json_stream.py``: a call's head (its name) and its arguments read as they are written:
  the incremental JSON scanner that checks and minifies them.
- ``parser.py``: the ToolParser interface and the block engine behind every format.
- ``hermes.py``, ``llama3.py``, ``mistral.py``: one model family's markup each.
- ``select.py``: PARSERS by name, and the parser a chat template implies.
"""

from tandem.router.tools.call import (
    CallDelta,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolDelta,
    collect,
    new_call_id,
)
from tandem.router.tools.constrained import (
    ConstrainedStream,
    ToolParseError,
    choice_schema,
    parse_constrained,
)
from tandem.router.tools.hermes import HermesToolParser
from tandem.router.tools.llama3 import Llama3JsonToolParser
from tandem.router.tools.mistral import MistralToolParser
from tandem.router.tools.parser import StreamingToolParser, ToolParser
from tandem.router.tools.select import PARSERS, parser_for
from tandem.router.tools.spec import (
    MAX_TOOLS,
    ToolChoice,
    ToolRequest,
    ToolSpec,
    parse_function_call,
    parse_functions,
    parse_request_tools,
    parse_tool_choice,
    parse_tools,
    to_template_tools,
)

__all__ = [
    "MAX_TOOLS",
    "PARSERS",
    "CallDelta",
    "ConstrainedStream",
    "ContentDelta",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedOutput",
    "StreamingToolParser",
    "ToolCall",
    "ToolChoice",
    "ToolDelta",
    "ToolParseError",
    "ToolParser",
    "ToolRequest",
    "ToolSpec",
    "choice_schema",
    "collect",
    "new_call_id",
    "parse_constrained",
    "parse_function_call",
    "parse_functions",
    "parse_request_tools",
    "parse_tool_choice",
    "parse_tools",
    "parser_for",
    "to_template_tools",
]
