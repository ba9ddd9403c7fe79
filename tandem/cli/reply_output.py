"""What ``tandem generate`` and ``tandem chat`` print after a reply's text: its tool calls and
(when asked) its tokens' logprobs as JSON lines on stdout, and why it ended on stderr when that
was not a plain stop::

    It is sunny.                                                          (the text, streamed)
    {"id": "call_...", "type": "function", "function": {"name": "get_weather", "arguments": "{...}"}}
    {"token_id": 1042, "logprob": -0.31, "top_logprobs": [{"token_id": 1042, "logprob": -0.31}]}
    [tool_calls]                                                                    (stderr)

A call line is OpenAI's ``tool_calls`` item (``arguments`` is JSON text), so ``jq`` reads it
the same way; logprob lines name token ids (the client has no tokenizer).
"""

from __future__ import annotations

import json
from typing import TextIO

from tandem.sdk.results import GenerateResult


def extra_lines(result: GenerateResult) -> list[str]:
    """The JSON lines that follow a reply's text: its calls, then its logprobs."""
    lines = [
        json.dumps({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}}, ensure_ascii=False)
        for c in result.tool_calls
    ]
    lines += [
        json.dumps({"token_id": lp.token_id, "logprob": lp.logprob,
                    "top_logprobs": [{"token_id": t, "logprob": v} for t, v in lp.top]})
        for lp in result.logprobs
    ]
    return lines


def finish_note(reason: str) -> str | None:
    """``[reason]`` for a reply that did not simply stop (length, tool_calls, ...)."""
    return None if reason in ("", "stop") else f"[{reason}]"


def print_after_text(result: GenerateResult, stdout: TextIO, stderr: TextIO,
                     note: bool = True) -> None:
    """The JSON lines on ``stdout`` and (``note``) the finish note on ``stderr``."""
    for line in extra_lines(result):
        stdout.write(line + "\n")
    stdout.flush()
    reason = finish_note(result.finish_reason)
    if note and reason is not None:
        print(reason, file=stderr)
