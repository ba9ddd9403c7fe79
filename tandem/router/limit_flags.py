"""The router's flags that bound what one request or client may cost: body and client
limits, structured-output grammar complexity, admission by cost (RouterConfig's fields of
the same names; docs/openai_http.md "Limits", docs/security.md)."""

from __future__ import annotations

import argparse

from tandem.router.grammar_limits import GrammarLimits
from tandem.router.reasoning import PARSERS as REASONING_PARSERS
from tandem.router.tools import PARSERS


def add_limit_args(p: argparse.ArgumentParser) -> None:
    """What one client may cost the router (RouterConfig's fields of the same names)."""
    g = p.add_argument_group("client limits")
    g.add_argument("--max-stop-strings", type=int, default=4, help="stop strings per request")
    g.add_argument("--max-stop-chars", type=int, default=256, help="characters per stop string")
    g.add_argument("--max-stop-token-ids", type=int, default=64, help="stop token ids per request")
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest HTTP body or gRPC message (HTTP 413 / RESOURCE_EXHAUSTED above it)",
    )
    g.add_argument("--tokenizer-threads", type=int, default=2, help="threads that tokenize")
    g.add_argument(
        "--tool-call-parser", default="auto", choices=("auto", *sorted(PARSERS)),
        help="how chat outputs are read for tool calls (auto: from the chat template)",
    )
    g.add_argument(
        "--reasoning-parser", default="", choices=sorted(REASONING_PARSERS),
        help="split a reasoning model's thinking (<think>...</think>) from its answer: "
        "chat's reasoning_content, the Responses API's reasoning items (default: none, the "
        "thinking stays in the text)",
    )
    g.add_argument(
        "--max-inflight-per-connection",
        type=int,
        default=128,
        help="sequences one client connection may have in flight or queued (0: no bound)",
    )
    g.add_argument(
        "--max-inflight-per-key",
        type=int,
        default=-1,
        help="sequences one API key may have in flight or queued, with API keys configured "
        "(0: no bound; default -1: as --max-inflight)",
    )
    g.add_argument(
        "--http-read-timeout",
        type=float,
        default=75.0,
        help="seconds an HTTP client gets to send a request's head, then its body",
    )


def add_grammar_limit_args(p: argparse.ArgumentParser) -> None:
    """How complex a structured output's grammar may be (RouterConfig's ``grammar_max_*``;
    tandem/router/grammar_limits.py says what each costs a worker's compile)."""
    g = p.add_argument_group("structured-output limits (400 above them, before any worker "
                             "compiles the grammar)")
    d = GrammarLimits()
    g.add_argument("--grammar-max-properties", type=int, default=d.max_properties,
                   help="properties in one JSON Schema object")
    g.add_argument("--grammar-max-schema-nodes", type=int, default=d.max_schema_nodes,
                   help="JSON objects and arrays in one schema")
    g.add_argument("--grammar-max-enum", type=int, default=d.max_enum,
                   help="values in one enum")
    g.add_argument("--grammar-max-branches", type=int, default=d.max_branches,
                   help="branches in one anyOf, oneOf or allOf")
    g.add_argument("--grammar-max-depth", type=int, default=d.max_depth,
                   help="nesting depth of a schema's objects and arrays")
    g.add_argument("--grammar-max-regex-chars", type=int, default=d.max_regex_chars,
                   help="characters in a regex (the regex kind, a schema's patterns)")
    g.add_argument("--grammar-max-rules", type=int, default=d.max_rules,
                   help="rules in an EBNF grammar")


def grammar_limit_fields(args: argparse.Namespace) -> dict[str, int]:
    """RouterConfig's ``grammar_max_*`` fields from the parsed flags."""
    return {f"grammar_{name}": getattr(args, f"grammar_{name}")
            for name in GrammarLimits.__slots__}
def add_admission_args(p: argparse.ArgumentParser) -> None:
    """Admission by cost and the HTTP edge's request caps (RouterConfig's fields of the same
    names; docs/openai_http.md "Limits")."""
    g = p.add_argument_group("admission by cost")
    g.add_argument("--max-inflight-tokens", type=int, default=1 << 21,
                   help="prompt tokens the router runs at once (--max-inflight counts "
                   "sequences; 0: no bound; raised to the context length)")
    g.add_argument("--max-inflight-tokens-per-connection", type=int, default=1 << 20,
                   help="prompt tokens one client connection may hold (0: no bound)")
    g.add_argument("--max-inflight-tokens-per-key", type=int, default=-1,
                   help="prompt tokens one API key may hold (0: no bound; default -1: as "
                   "--max-inflight-tokens)")
    g.add_argument("--max-fanout", type=int, default=128,
                   help="sequences one request may ask for: prompts x max(n, best_of) (400 "
                   "above it)")
    g.add_argument("--max-messages", type=int, default=2048,
                   help="messages in one chat request, content parts in one message (400 "
                   "above it)")
    g.add_argument("--max-connections-per-address", type=int, default=512,
                   help="HTTP connections one client address may hold open (0: no bound)")
    g.add_argument("--http-parse-threads", type=int, default=2,
                   help="threads that parse large HTTP bodies off the event loop")
    g.add_argument("--http-parse-queue", type=int, default=32,
                   help="large bodies that may wait for a parse thread (429 beyond it)")
