"""``--config FILE.yaml``: a process's flags from a YAML file, the command line winning.

    # router.yaml                       keys: long flag names, ``-`` or ``_`` alike
    port: 50051
    served_model_name: smollm2
    api-key: [sk-one, sk-two]           a list for a repeatable flag
    allow-unauthenticated: true         a boolean for an on/off flag

The file becomes argv (``--port=50051 --served-model-name=smollm2 ...``) put in front of the
command line's, so argparse checks types, choices and required flags exactly as it does for
typed ones. "The CLI wins" per flag: a flag given on the command line drops the file's value
for it, so a repeatable flag on the command line replaces the file's list rather than extending
it. An unknown key is an error naming the key; a value is never echoed (it may be a secret).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

CONFIG_FLAG = "--config"
_REFUSED = {CONFIG_FLAG, "--help", "-h"}  # keys that make no sense in a file
_SCALARS = (str, int, float, bool)


class ConfigFileError(ValueError):
    """The file cannot be read, is not a YAML mapping, or names a flag the process lacks."""


def load_config_file(path: str | Path) -> dict[str, object]:
    """The mapping of ``path`` (an empty file is an empty mapping); raises ConfigFileError.

    A YAML error reports its line and column only: the offending text may hold a secret."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigFileError(f"cannot read the config file {str(path)!r}: "
                              f"{err.strerror or err}") from err
    try:
        import yaml  # here: a client command that never reads a file needs no pyyaml
    except ModuleNotFoundError as err:  # a lean client installation (tandem-client)
        raise ConfigFileError("--config needs PyYAML: pip install pyyaml") from err

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigFileError(f"the config file {str(path)!r} is not valid YAML{where}") from err
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigFileError(f"the config file {str(path)!r} must be a mapping of flag names "
                              "to values")
    return data


def config_path(argv: Sequence[str]) -> str | None:
    """The value of the last ``--config FILE`` / ``--config=FILE`` in ``argv`` (None: none)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == CONFIG_FLAG and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(CONFIG_FLAG + "="):
            found = arg[len(CONFIG_FLAG) + 1:]
    return found


def given_actions(parser: argparse.ArgumentParser, argv: Iterable[str]) -> set[argparse.Action]:
    """The parser's actions that ``argv`` sets by one of their long or short names (exactly:
    the parser does not take abbreviations), up to a ``--``."""
    found: set[argparse.Action] = set()
    options = parser._option_string_actions
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("-"):
            action = options.get(arg.split("=", 1)[0])
            if action is not None:
                found.add(action)
    return found


def config_argv(
    parser: argparse.ArgumentParser,
    config: Mapping[str, object],
    *,
    source: str,
    skip: set[argparse.Action] | None = None,
) -> list[str]:
    """``config`` as argv for ``parser``, leaving out the flags whose action is in ``skip``
    (those the command line sets). Raises ConfigFileError naming ``source`` and the key."""
    out: list[str] = []
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        action = parser._option_string_actions.get(flag)
        if action is None or flag in _REFUSED or key.startswith("-"):
            raise ConfigFileError(f"{source}: unknown key {key!r} (keys are the long flag names "
                                  f"of {parser.prog}, without dashes)")
        if skip and action in skip:
            continue
        out += _tokens(flag, action, value, f"{source}: {key}")
    return out


def _tokens(flag: str, action: argparse.Action, value: object, where: str) -> list[str]:
    """One key's argv. Values go as ``--flag=value`` so one starting with ``-`` stays a value."""
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where} takes true or false")
        positive = next(o for o in action.option_strings if not o.startswith("--no-"))
        return [positive if value else "--no-" + positive[2:]]
    if action.nargs == 0:  # store_true/store_false/store_const: present or absent
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where} takes true or false")
        return [flag] if value else []
    items = list(value) if isinstance(value, list) else [value]
    if not all(isinstance(v, _SCALARS) for v in items):
        raise ConfigFileError(f"{where} takes a scalar or a list of scalars")
    text = [str(v).lower() if isinstance(v, bool) else str(v) for v in items]
    if isinstance(action, argparse._AppendAction | argparse._ExtendAction):
        return [f"{flag}={t}" for t in text]
    if action.nargs in (None, "?"):
        if isinstance(value, list):
            raise ConfigFileError(f"{where} takes one value, not a list")
        return [f"{flag}={text[0]}"]
    return [flag, *text]  # nargs "*", "+" or N: the values follow the flag
