"""The ``tandem-client`` distribution, as a client installs it: its wheel (built by pip from
packaging/tandem-client) into a fresh, bare venv, dependencies from wheels only (offline).

Proves: the install pulls no torch, ray, kubernetes or transformers (nor tandem-serve); the
SDK streams a greedy generation from that venv against a real router (its target from
``TANDEM_TARGET``), equal to what the repository's SDK gets; the venv's ``tandem generate``
prints the same text (``--target`` winning over a dead ``TANDEM_TARGET``); its ``tandem``
offers the client commands only and names ``tandem-serve`` for the rest; the workers end
holding no KV block.

The dependency wheels come from ``make install`` (``pip download`` into
``.venv/client-wheels``); without them the test downloads them from the package index and
skips when that is unreachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

import tandem
from tandem.launcher.local_cluster import ROOT, Proc
from tests.integration.sdk_cluster import LocalCluster, assert_idle
from tests.integration.served_model import TinyWorkers

HEAVY = ("torch", "ray", "kubernetes", "transformers", "tandem_serve")
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 12}
PROMPT = "The history of the city begins"

# Runs inside the client venv: what is installed there.
INSTALLED = """
import importlib.metadata, importlib.util, json, sys
heavy = sys.argv[1].split(",")
print(json.dumps({
    "dists": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "importable": [n for n in heavy if importlib.util.find_spec(n) is not None],
}))
"""

# Runs inside the client venv: one streamed greedy generation through the SDK.
STREAM = """
import json, sys
import tandem
[getattr(tandem, name) for name in tandem.__all__]  # every SDK name loads here
greedy = tandem.SamplingOptions(temperature=0.0, ignore_eos=True, max_tokens=12)
with tandem.Client() as client, client.generate_stream(sys.argv[1], sampling=greedy) as stream:
    chunks = list(stream)
print(json.dumps({
    "texts": [c.text for c in chunks],
    "finish": chunks[-1].finish_reason,
    "target": client.config.target,
    "sdk": tandem.__file__,
    "loaded": sorted(sys.modules),
}))
"""


@dataclass(frozen=True)
class ClientVenv:
    python: Path
    tandem: Path
    env: dict[str, str]  # no PYTHONPATH: the venv sees only what was installed into it

    def run(self, *args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                              timeout=300, cwd=self.python.parent, env={**self.env, **env})


def _clean_env() -> dict[str, str]:
    """This process's environment without what would leak the repository or the dev venv
    (PYTHONPATH, VIRTUAL_ENV), pip's settings, or a developer's TANDEM_* defaults."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "PIP_", "TANDEM_")) and k != "VIRTUAL_ENV"}


def _dependency_wheels(tmp: Path) -> Path:
    """``make install``'s wheels of the client's dependencies, else a fresh download (skip
    when the index is unreachable)."""
    cached = Path(sys.prefix) / "client-wheels"
    if cached.is_dir() and any(cached.glob("*.whl")):
        return cached
    out = tmp / "wheels"
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(out),
         str(ROOT / "packaging" / "tandem-client")],
        capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        pytest.skip(f"no {cached} (make install) and the package index is unreachable: "
                    f"{got.stderr.strip()[-300:]}")
    return out


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    tmp = tmp_path_factory.mktemp("client-dist")
    wheels = _dependency_wheels(tmp)
    env = _clean_env()
    pip_env = {**env, "PIP_CONFIG_FILE": os.devnull}  # no machine-wide index or find-links
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"),
         str(ROOT / "packaging" / "tandem-client")],
        capture_output=True, text=True, timeout=300, env=pip_env)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("tandem_client-*.whl")
    # A bare venv (no pip inside, no system site-packages); pip installs into it from here.
    venv.EnvBuilder(with_pip=False, clear=True).create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
         "--find-links", str(wheels), str(wheel)],
        capture_output=True, text=True, timeout=300, env=pip_env)
    assert installed.returncode == 0, installed.stderr
    return ClientVenv(python, tmp / "venv" / "bin" / "tandem", env)


def test_install_pulls_no_torch_ray_or_kubernetes(client_venv: ClientVenv) -> None:
    out = client_venv.run(client_venv.python, "-c", INSTALLED, ",".join(HEAVY))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["importable"] == []
    assert "tandem-client" in report["dists"] and "grpcio" in report["dists"]
    assert not {"torch", "ray", "kubernetes", "transformers", "tandem-serve"} & set(
        report["dists"]), report["dists"]


def test_client_venv_streams_from_a_cluster(
    client_venv: ClientVenv, tiny_workers: TinyWorkers, tiny_router: Proc
) -> None:
    with tandem.Client(tiny_router.grpc) as client:
        expected = client.generate(PROMPT, **GREEDY).text
    assert expected

    # The SDK from the venv, its target from the environment.
    out = client_venv.run(client_venv.python, "-c", STREAM, PROMPT,
                          TANDEM_TARGET=tiny_router.grpc)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["target"] == tiny_router.grpc
    assert Path(got["sdk"]).is_relative_to(client_venv.python.parent.parent)
    assert len(got["texts"]) > 1 and "".join(got["texts"]) == expected  # streamed, same text
    assert got["finish"] == "length"
    server = ("torch", "numpy", "tandem.engine", "tandem.router", "tandem.worker")
    assert not [m for m in got["loaded"]
                if m in server or m.startswith(tuple(s + "." for s in server))]
    assert "tandem.sdk.client" in got["loaded"]  # the check looks at full module names

    # The venv's `tandem generate`: --target wins over a dead TANDEM_TARGET.
    cli = client_venv.run(client_venv.tandem, "generate", "--target", tiny_router.grpc,
                          "--temperature", "0", "--ignore-eos", "--max-tokens", "12", PROMPT,
                          TANDEM_TARGET="127.0.0.1:1")
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == expected + "\n"
    assert_idle(LocalCluster(tiny_workers.cluster, tiny_workers.model, tiny_workers.prefill,
                             tiny_workers.decode))


def test_client_venv_offers_the_client_commands_only(client_venv: ClientVenv) -> None:
    usage = client_venv.run(client_venv.tandem, "--help")
    assert usage.returncode == 0, usage.stderr
    offered = [line.split()[0] for line in usage.stdout.splitlines() if line.startswith("  ")]
    assert offered == ["generate", "chat", "top", "bench"]
    up = client_venv.run(client_venv.tandem, "up")
    assert up.returncode == 2 and "pip install tandem-serve" in up.stderr
    bench = client_venv.run(client_venv.tandem, "bench", "--help")  # its extra is not here
    assert bench.returncode == 1 and "tandem-client[bench]" in bench.stderr


def test_client_venv_holds_the_load_generator(client_venv: ClientVenv) -> None:
    """``tandem bench``'s load generator comes with the wheel (no bench/ folder, no planner):
    its aiohttp-free modules import and build a run's requests there."""
    code = ("import json, sys\n"
            "from tandem.loadgen import multiturn, stats, workload\n"
            "specs = workload.make_requests(workload.MIXES['mixed'], 2.0, 5)\n"
            "convs = multiturn.make_conversations(1.0, 6)\n"
            "print(json.dumps({'specs': len(specs), 'turns': sum(len(c.turns) for c in convs),\n"
            "                  'loaded': sorted(m for m in sys.modules if m.startswith('tandem.'))}))\n")
    out = client_venv.run(client_venv.python, "-c", code)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["specs"] == 5 and got["turns"] == 6
    assert not [m for m in got["loaded"] if m.startswith(("tandem.planner", "tandem.engine"))]
