"""The ``tandem`` command: one entry point for every process role.

    tandem router  --port 50051 --prefill H:P,... --decode H:P,... --model smollm2
    tandem prefill --port P [engine flags]
    tandem decode  --port P --kv-port Q [engine flags]
    tandem local   [--model smollm2]                 (all three on this machine, no Ray)
    tandem offline --prompt TEXT [engine flags]      (the engine alone, no serving)
    tandem up      [--prefill N --decode N --address A --autoscale F.yaml]   (on Ray)
    tandem status | tandem down                      (what `up` runs; stop it)

Each subcommand is the same program as ``python -m router`` / ``prefill_worker`` /
``decode_worker`` / ``engine``; modules are imported only when their command runs. The
serving commands (router, prefill, decode, local, offline, up) also take ``--config
FILE.yaml``: keys are their long flag names, the command line wins.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "router": ("router.cli", "the public gRPC front door (routing, handoff, fallbacks)"),
    "prefill": ("prefill_worker.cli", "a prefill worker (builds KV, pushes it to decode)"),
    "decode": ("decode_worker.cli", "a decode worker (reservations, continuous batching)"),
    "local": ("tandem.local", "router + prefill + decode on this machine, no Ray (make serve)"),
    "offline": ("engine.__main__", "generate with the local engine (no router, no workers)"),
    "up": ("tandem.launcher.up", "a whole cluster on Ray (local or --address), autoscaled"),
    "status": ("tandem.launcher.status", "what `tandem up` runs, where, endpoints and health"),
    "down": ("tandem.launcher.down", "drain and stop everything `tandem up` started"),
    "generate": ("tandem.commands.generate", "stream one completion from a router"),
    "chat": ("tandem.commands.chat", "an interactive chat with a router (reads stdin)"),
    "top": ("tandem.commands.top", "a live view of every worker: load, KV, latency, transfer"),
    "bench": ("tandem.commands.bench", "a serving benchmark against a router (bench/serve.py)"),
    "profile": ("tandem.commands.profile", "measure a worker's step costs here (for tandem plan)"),
    "plan": ("tandem.commands.plan", "size P:D pools for a workload and SLO (simulated)"),
}


def _usage() -> str:
    lines = ["usage: tandem <command> [flags]   (tandem <command> --help for its flags)", ""]
    lines += [f"  {name:8s} {desc}" for name, (_, desc) in COMMANDS.items()]
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
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
