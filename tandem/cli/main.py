"""The ``tandem`` command: one entry point for every process role.

    tandem router  --port 50051 --prefill H:P,... --decode H:P,... --model smollm2
    tandem prefill --port P [engine flags]
    tandem decode  --port P --kv-port Q [engine flags]
    tandem local   [--model smollm2]                 (all three on this machine, no Ray)
    tandem offline --prompt TEXT [engine flags]      (the engine alone, no serving)
    tandem up      [--prefill N --decode N --address A --autoscale F.yaml]   (on Ray)
    tandem status | tandem down                      (what `up` runs; stop it)
    tandem drain WORKER [--migrate]                  (one worker leaves, its streams moved)
    tandem flip WORKER --to prefill|decode [--force] (a worker switches role, weights loaded)

Each subcommand is the same program as ``python -m tandem.router`` / ``prefill_worker`` /
``decode_worker`` / ``engine``; modules are imported only when their command runs. The
serving commands (router, prefill, decode, local, offline, up) also take ``--config
FILE.yaml``: keys are their long flag names, the command line wins.

This one file is the ``tandem`` command of both distributions (docs/client.md). The lean
``tandem-client`` ships only the client commands' modules (``CLIENT_COMMANDS``), so here a
command is offered when its module is installed: ``tandem --help`` in a client-only
environment lists generate, chat, bench and top, and names ``tandem-serve`` for the rest.
A client command never imports torch, ray or kubernetes (tests/unit/tandem/test_import.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

COMMANDS = {
    "router": ("tandem.router.cli", "the public gRPC front door (routing, handoff, fallbacks)"),
    "prefill": ("tandem.worker.prefill.cli", "a prefill worker (builds KV, pushes it to decode)"),
    "decode": ("tandem.worker.decode.cli", "a decode worker (reservations, continuous batching)"),
    "local": ("tandem.launcher.local", "router + prefill + decode on this machine, no Ray (make serve)"),
    "offline": ("tandem.engine.__main__", "generate with the local engine (no router, no workers)"),
    "up": ("tandem.launcher.up", "a whole cluster on Ray (local or --address), autoscaled"),
    "status": ("tandem.launcher.status", "what `tandem up` runs, where, endpoints and health"),
    "down": ("tandem.launcher.down", "drain and stop everything `tandem up` started"),
    "drain": ("tandem.cli.drain", "drain one worker via the router (--migrate: move its streams live)"),
    "flip": ("tandem.cli.flip", "switch a worker between prefill and decode via the router"),
    "worker": ("tandem.worker.dual.cli", "a worker that serves --role and can flip (tandem flip)"),
    "generate": ("tandem.cli.generate", "stream one completion from a router"),
    "chat": ("tandem.cli.chat", "an interactive chat with a router (reads stdin)"),
    "top": ("tandem.cli.top", "a live view of every worker: load, KV, latency, transfer"),
    "bench": ("tandem.cli.bench", "a serving benchmark against a router (tandem/loadgen)"),
    "profile": ("tandem.cli.profile", "measure a worker's step costs here (for tandem plan)"),
    "plan": ("tandem.cli.plan", "size P:D pools for a workload and SLO (simulated)"),
}

# The commands the tandem-client distribution ships (packaging/tandem-client/pyproject.toml).
CLIENT_COMMANDS = ("generate", "chat", "bench", "top")

# Optional packages of the client commands: import name -> (distribution, tandem-client's
# extra that brings it).
OPTIONAL = {
    "aiohttp": ("aiohttp", "bench"),
    "tqdm": ("tqdm", "bench"),
    "prometheus_client": ("prometheus-client", "top"),
    "matplotlib": ("matplotlib", "plot"),
    "yaml": ("pyyaml", "yaml"),
}


def missing_package(package: str) -> str:
    """What to tell a user whose installation lacks the optional ``package``."""
    dist, extra = OPTIONAL[package]
    return (f"needs the Python package {package!r}: pip install {dist} "
            f"(with tandem-client: pip install 'tandem-client[{extra}]')")


def has_package(package: str) -> bool:
    """Whether the top-level ``package`` is importable here (found, not imported)."""
    return importlib.util.find_spec(package) is not None


def installed(command: str) -> bool:
    """Whether ``command``'s module is importable here (found, not imported)."""
    try:
        return importlib.util.find_spec(COMMANDS[command][0]) is not None
    except ModuleNotFoundError:  # its package is not installed (a client-only environment)
        return False


def _usage() -> str:
    here = [name for name in COMMANDS if installed(name)]
    lines = ["usage: tandem <command> [flags]   (tandem <command> --help for its flags)", ""]
    lines += [f"  {name:8s} {COMMANDS[name][1]}" for name in here]
    absent = [name for name in COMMANDS if name not in here]
    if absent:
        lines += ["", f"not installed here (pip install tandem-serve): {', '.join(absent)}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``tandem <command> ...`` to that role's ``main(argv)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"tandem: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if not installed(command):
        print(f"tandem: {command!r} is a server command, not in this installation "
              f"(tandem-client has {', '.join(CLIENT_COMMANDS)}): pip install tandem-serve",
              file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as err:
        package = (err.name or "").partition(".")[0]
        if package not in OPTIONAL:
            raise
        print(f"tandem {command}: {missing_package(package)}", file=sys.stderr)
        return 1
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
