"""``tandem generate "prompt"``: stream one completion from a router to the terminal.

    tandem generate --target 127.0.0.1:50051 "Once upon a time" --max-tokens 64
    tandem generate --chat --system "Be brief." "What is KV caching?"
    echo "prompt from a pipe" | tandem generate -
    tandem generate --json-schema person.json "Describe a person as JSON."
    tandem generate --tools tools.json --tool-choice required "Weather in Paris?"
    tandem generate --logprobs --top-logprobs 3 --logit-bias 198=-100 "Hello"

``--chat`` sends the prompt as a user message (rendered by the model's chat template);
``--system`` and ``--tools`` imply it. After the text come the tool calls the model made and
(with ``--logprobs``) each token's logprob, as JSON lines; a reply that did not simply stop
says why on stderr (``[length]``, ``[tool_calls]``). ``--stats`` prints finish reason, token
counts and timings to stderr instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tandem.cli.common import (
    add_client_args,
    add_sampling_args,
    client_config_from_args,
    fail,
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
from tandem.sdk.results import ResultBuilder, StreamChunk


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="tandem generate", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", help="the prompt ('-' reads it from stdin)")
    p.add_argument("--chat", action="store_true", help="send as a chat message")
    p.add_argument("--system", default=None, help="system message (implies --chat)")
    p.add_argument("--stats", action="store_true", help="print usage and timings to stderr")
    add_client_args(p)
    add_sampling_args(p)
    add_tool_args(p)
    add_logprob_args(p)
    return p


def stats_line(last: StreamChunk) -> str:
    """One line about a finished generation: why it ended, tokens, TTFT and total time."""
    usage, t = last.usage, last.timings
    if usage is None or t is None:
        return f"[{last.finish_reason}]"
    return (f"[{last.finish_reason}; prompt {usage.prompt_tokens} tokens "
            f"({usage.cached_tokens} cached), completion {usage.completion_tokens} tokens; "
            f"TTFT {t.first_token_s * 1e3:.0f} ms; total {t.total_s:.2f} s]")


def main(argv: Sequence[str] | None = None) -> int:
    """Stream the completion to stdout; 1 on a service error, 2 on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = client_config_from_args(args)
        options = sampling_from_args(args)  # reads a schema or grammar file
        tools = tool_options(args)
        options.update(tools)
        options.update(logprob_options(args))
    except (ValueError, OSError) as err:
        parser.error(str(err))
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.chat or args.system is not None or tools:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        request = {"messages": messages}
    else:
        request = {"prompt": prompt}
    reply = ResultBuilder()
    last = None
    try:
        with Client(config=config) as client, client.generate_stream(**request, **options) as s:
            for chunk in s:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                reply.add(chunk)
                last = chunk
    except TandemError as err:
        sys.stdout.write("\n" if last is not None else "")
        return fail("tandem generate", err)
    except KeyboardInterrupt:  # the stream's with-block cancelled the request
        sys.stdout.write("\n")
        return 130
    sys.stdout.write("\n")
    print_after_text(reply.result(), sys.stdout, sys.stderr, note=not args.stats)
    if args.stats and last is not None:
        print(stats_line(last), file=sys.stderr)
    return 0
