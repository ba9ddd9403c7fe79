"""Flags shared by the client commands: where the router is, how to authenticate, sampling.

``--target`` and the API key fall back to ``TANDEM_TARGET`` and ``TANDEM_API_KEY`` (as the SDK
does, ``tandem.sdk.client_config``); a flag given wins. Prefer the variable or ``--api-key-file``
to ``--api-key``: a command line is visible to every user of the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tandem.cli.generation_flags import (
    add_structured_args,
    logit_bias_option,
    structured_option,
)
from tandem.sdk.client_config import (
    API_KEY_ENV,
    DEFAULT_TARGET,
    TARGET_ENV,
    ClientConfig,
    TLSConfig,
)
from tandem.sdk.errors import TandemError


def add_client_args(p: argparse.ArgumentParser, timeout: bool = True) -> None:
    """--target, API key and TLS flags (what ``ClientConfig`` holds); ``timeout=False`` leaves
    --timeout to a caller that defines its own."""
    g = p.add_argument_group("connection")
    g.add_argument("--target", default=None,
                   help=f"router HOST:PORT (default: ${TARGET_ENV}, else {DEFAULT_TARGET})")
    # The help names the variable, never its value (a secret).
    g.add_argument("--api-key", default=None,
                   help=f"API key, sent as a bearer token (default: ${API_KEY_ENV})")
    g.add_argument("--api-key-file", default=None, help="read the API key from this file")
    g.add_argument("--tls-ca", default=None, help="CA bundle to verify the router (enables TLS)")
    g.add_argument("--tls", action="store_true", help="TLS with the system's CA roots")
    g.add_argument("--tls-cert", default=None, help="client certificate (mTLS)")
    g.add_argument("--tls-key", default=None, help="client private key (mTLS)")
    g.add_argument("--tls-server-name", default=None, help="name to check the certificate for")
    if timeout:
        g.add_argument("--timeout", type=float, default=600.0, help="per-call deadline, seconds")


def api_key_from_args(args: argparse.Namespace) -> str | None:
    """The key of --api-key, or the first non-comment line of --api-key-file (None: neither
    flag given, so the environment's key applies)."""
    if args.api_key_file:
        for line in Path(args.api_key_file).read_text().splitlines():
            key = line.split("#", 1)[0].strip()
            if key:
                return key
        raise ValueError(f"--api-key-file {args.api_key_file!r} holds no key")
    return str(args.api_key) if args.api_key else None


def client_config_from_args(args: argparse.Namespace) -> ClientConfig:
    """A validated ClientConfig (flags first, then the environment's target and key);
    raises ValueError with the flag's or the variable's problem."""
    tls = None
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.tls_server_name:
        tls = TLSConfig(ca_cert=args.tls_ca, client_cert=args.tls_cert,
                        client_key=args.tls_key, server_name=args.tls_server_name)
    explicit: dict[str, object] = {"tls": tls, "timeout_s": args.timeout}
    if args.target is not None:
        explicit["target"] = args.target
    key = api_key_from_args(args)
    if key is not None:
        explicit["api_key"] = key
    return ClientConfig.from_env(**explicit)


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    """Sampling flags; unset ones keep the server's defaults."""
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--temperature", type=float, default=None, help="0: greedy")
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--repetition-penalty", type=float, default=None)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", default=None)
    g.add_argument("--model", default="", help="model id (default: the served one)")
    add_structured_args(g)


_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
             "presence_penalty", "frequency_penalty", "seed", "stop", "ignore_eos")


def sampling_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options for ``Client.generate`` that the flags set; raises FlagError (a
    ValueError naming the flag) for a value that cannot be used."""
    options: dict[str, Any] = {n: getattr(args, n) for n in _SAMPLING
                               if getattr(args, n) is not None}
    if args.model:
        options["model"] = args.model
    structured = structured_option(args)
    if structured is not None:
        options["structured"] = structured
    bias = logit_bias_option(args)
    if bias is not None:
        options["logit_bias"] = bias
    return options


def fail(prog: str, err: TandemError | ValueError | OSError) -> int:
    """Report ``err`` on stderr; the exit status of a failed client command (1)."""
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 1
