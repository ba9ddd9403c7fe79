"""``import tandem`` is the client SDK only: grpc and protobuf, never torch, ray or the
server packages (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

# Top-level packages and tandem's server packages (a module counts when it is one of these
# or below one).
HEAVY = ("torch", "ray", "transformers", "tokenizers", "numpy", "aiohttp", "tandem.engine",
         "tandem.router", "tandem.worker", "tandem.kv_transfer", "tandem.autoscaler",
         "tandem.launcher", "tandem.planner", "tandem.profiler")


def _loaded(code: str) -> set[str]:
    """Every module name loaded after ``code`` runs in a fresh interpreter."""
    code += "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return set(json.loads(out.stdout))


def _heavy(loaded: set[str], heavy: set[str]) -> set[str]:
    return {m for m in loaded for h in heavy if m == h or m.startswith(h + ".")}


def test_import_tandem_pulls_in_no_server_or_ml_packages() -> None:
    loaded = _loaded("import tandem\n[getattr(tandem, name) for name in tandem.__all__]")
    assert "grpc" in loaded and "google" in loaded
    assert not _heavy(loaded, set(HEAVY)), _heavy(loaded, set(HEAVY))


def test_client_commands_pull_in_no_server_or_ml_packages() -> None:
    """The server distribution's ``tandem generate/chat/bench/top`` load none of it either
    (what lets tandem-client ship them without torch; bench alone needs aiohttp)."""
    loaded = _loaded(
        "import tandem.cli.main\n"
        "for name in tandem.cli.main.CLIENT_COMMANDS:\n"
        "    __import__(tandem.cli.main.COMMANDS[name][0])"
    )
    heavy = set(HEAVY) - {"aiohttp"} | {"kubernetes", "yaml", "prometheus_client"}
    assert "tandem.loadgen.load" in loaded  # tandem bench's load generator
    assert not _heavy(loaded, heavy), _heavy(loaded, heavy)


def test_the_load_generator_pulls_in_no_server_or_ml_packages() -> None:
    """tandem/loadgen, every module of it, ships in the lean client: grpc, protos, aiohttp."""
    loaded = _loaded(
        "import pkgutil, tandem.loadgen\n"
        "for m in pkgutil.iter_modules(tandem.loadgen.__path__):\n"
        "    __import__(f'tandem.loadgen.{m.name}')"
    )
    assert {"tandem.loadgen.sweep", "tandem.loadgen.report", "tandem.loadgen.run"} <= loaded
    heavy = set(HEAVY) - {"aiohttp"} | {"kubernetes", "matplotlib"}
    assert not _heavy(loaded, heavy), _heavy(loaded, heavy)
