"""``import tandem`` is the client SDK only: grpc and protobuf, never torch, ray or the
server packages (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "ray", "engine", "router", "worker", "prefill_worker", "decode_worker",
         "kv_transfer", "transformers", "tokenizers", "numpy", "aiohttp")


def test_import_tandem_pulls_in_no_server_or_ml_packages() -> None:
    code = (
        "import json, sys, tandem\n"
        "[getattr(tandem, name) for name in tandem.__all__]\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    loaded = set(json.loads(out.stdout))
    assert "grpc" in loaded and "google" in loaded
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_client_commands_pull_in_no_server_or_ml_packages() -> None:
    """The server distribution's ``tandem generate/chat/bench/top`` load none of it either
    (what lets tandem-client ship them without torch; bench alone needs aiohttp)."""
    code = (
        "import json, sys, tandem.cli.main\n"
        "for name in tandem.cli.main.CLIENT_COMMANDS:\n"
        "    __import__(tandem.cli.main.COMMANDS[name][0])\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    loaded = set(json.loads(out.stdout))
    heavy = set(HEAVY) - {"aiohttp"} | {"kubernetes", "autoscaler", "yaml", "prometheus_client"}
    assert not loaded & heavy, loaded & heavy
