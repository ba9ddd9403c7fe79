"""The engine flags ``tandem local`` and ``tandem up`` take and pass on to what they start.

    tandem local --quantization int4 --max-model-len 4096
        -> each worker:  --quantization=int4 --max-model-len=4096
        -> the router:   --max-model-len=4096     (the flags whose meaning it shares)

The definitions are the workers' own (tandem/engine/cli_args.py), so names, types and choices match;
a flag not given is not passed, and each process keeps its own default. The logging, tracing
and metric-name flags (``--log-format``, ``--log-level``, ``--otlp-endpoint``, ``--trace-file``
..., ``--metrics-compat``: tandem/common/obs/log_format.py, tandem/common/obs/tracing_setup.py,
tandem/common/obs/metrics_export.py) go to every process, router included. The flags that
say how chat outputs are read (``--reasoning-parser``, ``--tool-call-parser``: vLLM users type
them on the one command line) go to the router.
"""

from __future__ import annotations

import argparse

from tandem.common.arg_parser import ArgParser
from tandem.common.obs.log_format import add_log_args, log_argv
from tandem.common.obs.metrics_export import COMPAT_VLLM, add_metrics_compat_arg
from tandem.common.obs.tracing_setup import add_tracing_args, tracing_argv
from tandem.engine.cli_args import add_forwarded_engine_args, forwarded_engine_argv

# What the launchers define themselves: --model (resolved once, up front) and threads (split
# among the workers of one machine).
OWN_FLAGS = ("--model", "--threads")
# Engine flags the router takes too, with the same meaning: the context length it validates
# prompts against, the block size its prefix affinity hashes by, and the runtime LoRA updates
# (its admin routes fan a load or unload out to every worker, each of which must allow it).
ROUTER_FLAGS = ("--max-model-len", "--block-size", "--allow-runtime-lora-updates")

_ArgGroup = argparse._ArgumentGroup  # what add_argument_group returns


def add_launcher_engine_args(parser: argparse.ArgumentParser) -> None:
    """The workers' engine flags, but ``OWN_FLAGS``, on a launcher's parser."""
    add_forwarded_engine_args(parser, skip=OWN_FLAGS)


def add_passthrough_args(parser: ArgParser, group: _ArgGroup | None = None) -> None:
    """``--worker-arg`` and ``--router-arg`` (repeatable escape hatches for any flag of the
    workers or the router; ``--worker-arg --x=y`` and ``--worker-arg=--x=y`` alike)."""
    g = group if group is not None else parser
    g.add_argument("--worker-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for every worker (repeat; e.g. --worker-arg --no-kv-shm)")
    g.add_argument("--router-arg", action="append", default=[], metavar="FLAG",
                   help="extra flag for the router (repeat)")
    parser.passthrough("--worker-arg", "--router-arg")


def worker_engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags given to the launcher, as every worker's argv."""
    return forwarded_engine_argv(args)


def router_engine_argv(args: argparse.Namespace) -> list[str]:
    """The given engine flags the router shares (``ROUTER_FLAGS``) and the chat-output flags
    (``add_router_output_args``), as its argv."""
    return [*forwarded_engine_argv(args, only=ROUTER_FLAGS), *router_output_argv(args)]


def add_router_output_args(parser: argparse.ArgumentParser) -> None:
    """The router's flags for reading chat outputs, on a launcher's parser (default None: not
    passed, the router keeps its own)."""
    from tandem.router.reasoning import PARSERS as REASONING
    from tandem.router.tools import PARSERS as TOOLS

    g = parser.add_argument_group("chat outputs (passed to the router)")
    g.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING),
                   help="split a reasoning model's thinking from its answer "
                   "(reasoning_content; default: none)")
    g.add_argument("--tool-call-parser", default=None, choices=("auto", *sorted(TOOLS)),
                   help="how chat outputs are read for tool calls (default auto: from the "
                   "chat template)")


def router_output_argv(args: argparse.Namespace) -> list[str]:
    """The chat-output flags given to the launcher, as the router's argv."""
    return [f"--{name.replace('_', '-')}={getattr(args, name)}"
            for name in ("reasoning_parser", "tool_call_parser")
            if getattr(args, name, None) is not None]


def add_observability_args(parser: argparse.ArgumentParser) -> None:
    """The logging, tracing and metric-name flags every started process takes, on a
    launcher's parser."""
    add_log_args(parser)
    add_tracing_args(parser)
    add_metrics_compat_arg(parser)


def observability_argv(args: argparse.Namespace) -> list[str]:
    """The logging, tracing and metric-name flags given to the launcher, as every process's
    argv (a flag left at its default is not passed)."""
    compat = getattr(args, "metrics_compat", COMPAT_VLLM)
    return [*log_argv(args), *tracing_argv(args),
            *([f"--metrics-compat={compat}"] if compat != COMPAT_VLLM else [])]
