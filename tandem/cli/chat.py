"""``tandem chat``: an interactive conversation with a router's model.

Each line on stdin is a user turn; the reply streams back and both join the conversation, so
the model sees every earlier turn (rendered through its chat template). ``/reset`` forgets the
conversation, ``/exit`` (or end of input) quits. Reads plain stdin, so it can be scripted:

    printf 'Hi!\\nWhat did I just say?\\n' | tandem chat --target 127.0.0.1:50051

The generate flags for structured outputs, tools, logit bias and logprobs apply to every
turn. Tool calls and logprobs print as JSON lines after a reply, and a reply that did not
simply stop says why on stderr (``[length]``, ``[tool_calls]``). The chat cannot send a
tool's result back: a reply that is only tool calls is not kept in the conversation.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from tandem.cli.common import (
    add_client_args,
    add_sampling_args,
    client_config_from_args,
    sampling_from_args,
)
from tandem.cli.generation_flags import (
    add_logprob_args,
    add_tool_args,
    logprob_options,
    tool_options,
)
from tandem.cli.reply_output import print_after_text
from tandem.common.arg_parser import ArgParser
from tandem.sdk.client import Client
from tandem.sdk.errors import TandemError
from tandem.sdk.results import ResultBuilder


class Conversation:
    """The chat so far as OpenAI-shaped messages (what ``Client.generate`` takes)."""

    def __init__(self, system: str | None = None) -> None:
        self._system = system
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self._system}] if self._system else []

    def ask(self, text: str) -> list[dict[str, str]]:
        """The messages to send for a new user turn (not kept until the reply arrives)."""
        return [*self.messages, {"role": "user", "content": text}]

    def commit(self, question: str, reply: str) -> None:
        self.messages += [{"role": "user", "content": question},
                          {"role": "assistant", "content": reply}]


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="tandem chat", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", default=None, help="system message")
    add_client_args(p)
    add_sampling_args(p, max_tokens=512)
    add_tool_args(p)
    add_logprob_args(p)
    return p


def run(client: Client, conversation: Conversation, options: dict[str, object],
        stdin: TextIO, stdout: TextIO, interactive: bool) -> int:
    """The read-reply loop; returns the exit status (1 if any turn failed)."""
    status = 0
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            conversation.reset()
            continue
        reply = ResultBuilder()
        try:
            with client.generate_stream(messages=conversation.ask(text), **options) as stream:
                for chunk in stream:
                    reply.add(chunk)
                    stdout.write(chunk.text)
                    stdout.flush()
        except TandemError as err:
            stdout.write("\n")
            print(f"tandem chat: error: {err}", file=sys.stderr)
            status = 1
            continue  # the failed turn is not kept
        stdout.write("\n")
        result = reply.result()
        print_after_text(result, stdout, sys.stderr)
        if result.text:  # a reply of tool calls only has nothing to keep
            conversation.commit(text, result.text)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Chat until end of input or /exit."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = client_config_from_args(args)
        options = sampling_from_args(args)
        options.update(tool_options(args))
        options.update(logprob_options(args))
    except (ValueError, OSError) as err:
        parser.error(str(err))
    with Client(config=config) as client:
        try:
            return run(client, Conversation(args.system), options, sys.stdin,
                       sys.stdout, sys.stdin.isatty())
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            return 0
