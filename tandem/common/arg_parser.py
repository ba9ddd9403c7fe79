"""The argument parser of every Tandem command: argparse without its three surprises.

- No abbreviations (``allow_abbrev=False``): ``--api-key`` is never taken for
  ``--api-key-file``, and a flag added later cannot change what an old command line means.
- An unknown argument is refused without echoing values: ``unrecognized arguments:
  --api-kee VALUE`` (what follows a flag may be a secret; argparse would print it).
- A pass-through flag (``--worker-arg``) takes the next word as its value even when that word
  starts with ``-``: ``--worker-arg --num-blocks=512`` and ``--worker-arg=--num-blocks=512``
  mean the same.

With ``config_file=True`` the parser also takes ``--config FILE.yaml`` (tandem/common/config_file.py):
the file's flags first, the command line's winning, checked like typed ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tandem.common.config_file import (
    CONFIG_FLAG,
    ConfigFileError,
    config_argv,
    config_path,
    given_actions,
    load_config_file,
)

REDACTED = "VALUE"


class ArgParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with no abbreviations, redacted unknown arguments,
    pass-through flags and, with ``config_file=True``, ``--config FILE.yaml``."""

    def __init__(self, *args: Any, config_file: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._passthrough: set[str] = set()
        self._config_file = config_file
        if config_file:
            self.add_argument(CONFIG_FLAG, metavar="FILE.yaml", default=None,
                              help="flags from a YAML file (keys: long flag names; "
                                   "the command line wins)")

    def passthrough(self, *flags: str) -> None:
        """Make ``flags`` (added already, each taking one value) pass-through: their value is
        another command's flag, so the next word is taken even when it starts with ``-``."""
        unknown = [f for f in flags if f not in self._option_string_actions]
        if unknown:
            raise ValueError(f"no such flags to make pass-through: {unknown}")
        self._passthrough.update(flags)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, after joining pass-through flags to their values and putting the
        ``--config`` file's flags in front of the command line's."""
        argv = self._join_passthrough(list(sys.argv[1:] if args is None else args))
        path = config_path(argv) if self._config_file else None
        if path is not None:
            try:
                from_file = config_argv(self, load_config_file(path), source=path,
                                        skip=given_actions(self, argv))
            except ConfigFileError as err:
                self.error(str(err))
            argv = [*from_file, *argv]
        return super().parse_known_args(argv, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> argparse.Namespace:
        """argparse's, but an unknown argument's error names flags only, never values."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error("unrecognized arguments: " + " ".join(redact(extra)))
        return parsed

    def _join_passthrough(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(argv):
            if argv[i] == "--":
                return out + argv[i:]
            if argv[i] in self._passthrough and i + 1 < len(argv):
                out.append(f"{argv[i]}={argv[i + 1]}")
                i += 2
                continue
            out.append(argv[i])
            i += 1
        return out


def refused(reason: str) -> type[argparse.Action]:
    """An action for a flag that is known and refused: given (typed, or ``true`` in a
    ``--config`` file), parsing fails naming the flag and ``reason`` (exit status 2), where
    an unknown flag would only say "unrecognized"."""

    class _Refused(argparse.Action):
        def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
            kwargs["nargs"] = 0
            kwargs.pop("metavar", None)
            super().__init__(option_strings, dest, **kwargs)

        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            parser.error(f"{option_string}: {reason}")

    return _Refused


def redact(argv: Sequence[str]) -> list[str]:
    """``argv`` with every value hidden: ``--flag=x`` -> ``--flag=VALUE``, a word that is not a
    flag -> ``VALUE``."""
    out = []
    for arg in argv:
        if arg.startswith("-") and len(arg) > 1 and " " not in arg:
            name, eq, _ = arg.partition("=")
            out.append(f"{name}={REDACTED}" if eq else name)
        else:
            out.append(REDACTED)
    return out
