"""The API keys a launcher (``tandem local``, ``tandem up``) hands its router, never on a
command line.

    tandem local|up --api-key K1 --api-key K2 --api-key-file F
      launcher: checks them by the router's own rules (tandem/router/auth.py), joins them into one
                key-file text (the inline keys, then F's lines)
      router's machine: that text in a 0600 file in a fresh 0700 folder -> --api-key-file

``tandem local`` writes the file itself and passes its path to the router process; ``tandem
up`` ships the text to the router actor as it ships the cluster secret, and the actor writes
the file on its node and removes it once the router has read it. A key is never logged.

The admin keys (``--admin-key-file``: they open the router's runtime LoRA routes only, which
``--allow-runtime-lora-updates`` turns on) stay in the user's own file: ``tandem local`` checks
it before anything starts and hands the router its absolute path.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

KEY_FILE = "api-keys"


def add_api_key_args(
    parser: argparse.ArgumentParser, group: argparse._ArgumentGroup | None = None,
) -> None:
    """``--api-key KEY`` (repeatable, vLLM's name) and ``--api-key-file FILE``."""
    g: argparse._ActionsContainer = group if group is not None else parser
    g.add_argument("--api-key", dest="api_keys", action="append", default=[], metavar="KEY",
                   help="an API key the router accepts (repeat for several; the router gets it "
                   "in a private file, but this command line is visible to other local "
                   "users: prefer --api-key-file or --config)")
    g.add_argument("--api-key-file", default="", metavar="FILE",
                   help="API keys the router accepts, one per line (# comments)")


def key_file_text(args: argparse.Namespace) -> str:
    """The router's key-file text for ``--api-key``/``--api-key-file`` ("" when none given).
    Raises ValueError (tandem.router.auth.ApiKeyFileError) for an empty or spaced key, or a file
    that is unreadable or holds none, without quoting a key."""
    from tandem.router.auth import ApiKeys

    inline = list(args.api_keys)
    if ApiKeys.load(args.api_key_file, inline) is None:
        return ""
    text = "".join(f"{key}\n" for key in inline)
    if args.api_key_file:
        text += Path(args.api_key_file).read_text()
    return text


def write_key_file(text: str) -> Path:
    """``text`` in a new file only this user can read (a fresh 0700 folder); the caller
    removes the folder (``path.parent``) when the router has read it."""
    folder = Path(tempfile.mkdtemp(prefix="tandem-api-keys-"))
    path = folder / KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def add_admin_key_arg(parser: argparse.ArgumentParser) -> None:
    """``--admin-key-file FILE``: the keys of the router's admin routes."""
    parser.add_argument("--admin-key-file", default="", metavar="FILE",
                        help="keys that open the router's admin routes only (POST "
                        "/v1/load_lora_adapter and /v1/unload_lora_adapter, served with "
                        "--allow-runtime-lora-updates), one per line")


def admin_key_argv(args: argparse.Namespace, runtime_updates: bool) -> list[str]:
    """The router's ``--admin-key-file`` flag (the file's absolute path: the router may run
    in another folder), or [] when none is given. Raises ValueError (ApiKeyFileError) for a
    file that is unreadable or holds no key, and when ``runtime_updates`` (the runtime LoRA
    routes) would have no key to open them: those routes are never open."""
    from tandem.router.auth import ApiKeyFileError, ApiKeys

    if not args.admin_key_file:
        if runtime_updates:
            raise ApiKeyFileError("--allow-runtime-lora-updates needs --admin-key-file (the "
                                  "router's admin routes are never open)")
        return []
    ApiKeys.load(args.admin_key_file)
    return ["--admin-key-file", str(Path(args.admin_key_file).resolve())]


def check_admin_flags(router_args: Sequence[str]) -> None:
    """Refuse, before anything starts, router flags (``tandem up``'s, ``--router-arg`` among
    them) that turn the runtime LoRA routes on without ``--admin-key-file``: the router would
    refuse to start (its admin routes are never open)."""
    flags = {a.split("=", 1)[0] for a in router_args}
    if "--allow-runtime-lora-updates" in flags and "--admin-key-file" not in flags:
        raise ValueError("--allow-runtime-lora-updates needs the router's --admin-key-file "
                         "(--router-arg=--admin-key-file=FILE, a file on the router's node)")
