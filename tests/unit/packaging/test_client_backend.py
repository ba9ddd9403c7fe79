"""packaging/tandem-client: the build backend ships exactly the files its ``ship`` globs select,
refuses to build when one of their modules imports a server or ML package anywhere or a module
of ours that does not ship, and writes a wheel whose files are the repository's own bytes (so
it and tandem-serve can share an environment), whose metadata requires grpcio and protobuf
only, and which rebuilds identically from its sdist."""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import tandem
from tandem.cli import main as cli

ROOT = Path(__file__).resolve().parents[3]
PACKAGING = ROOT / "packaging" / "tandem-client"
# What a client may import besides the standard library: its dependencies and extras.
ALLOWED = {"grpc", "google", "grpc_health", "aiohttp", "tqdm", "prometheus_client",
           "matplotlib", "yaml"}
FORBIDDEN = {"torch", "ray", "kubernetes", "transformers", "tandem.engine", "tandem.router",
             "tandem.worker", "tandem.kv_transfer", "tandem.autoscaler", "tandem.launcher",
             "tandem.planner", "tandem.profiler", "bench", "scripts"}


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


@pytest.fixture(scope="module")
def backend() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(
        "tandem_client_backend", PACKAGING / "tandem_client_backend.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    try:
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as err:  # Python 3.10 without tomli (pip provides it there)
            pytest.skip(f"the backend needs {err.name} here")
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def serve(backend: ModuleType) -> dict[str, Any]:
    """The repository's pyproject.toml (tandem-serve), read as the backend reads its own."""
    return backend.tomllib.loads((ROOT / "pyproject.toml").read_text())


def _third_party(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.partition(".")[0])
    return tops - set(sys.stdlib_module_names)


def test_ships_the_sdk_and_client_commands_and_nothing_heavy(backend: ModuleType) -> None:
    modules = backend.shipped_modules(backend.load_project())
    sdk = {tandem._EXPORTS[name] for name in tandem.__all__}
    commands = {cli.COMMANDS[name][0] for name in cli.CLIENT_COMMANDS}
    assert sdk | commands | {"tandem.cli.main", "tandem.protos.v1.tandem_pb2"} <= set(modules)
    assert not [m for m in modules if _forbidden(m)]
    server_only = {"tandem.launcher.local", "tandem.launcher", "tandem.cli.plan",
                   "tandem.cli.profile", "tandem.planner.workload", "bench.engine.vs_transformers"}
    assert not server_only & set(modules)
    ours = {m.partition(".")[0] for m in modules}
    imports = set().union(*(_third_party(p) for p in modules.values())) - ours
    assert imports <= ALLOWED, imports - ALLOWED


def test_what_the_client_commands_load_is_shipped(backend: ModuleType) -> None:
    """The check is static; this runs the client's entry points in a fresh interpreter and
    finds every module of ours they load among the shipped ones."""
    modules = backend.shipped_modules(backend.load_project())
    code = (
        "import json, sys, tandem, tandem.cli.main\n"
        "[getattr(tandem, name) for name in tandem.__all__]\n"
        "for name in tandem.cli.main.CLIENT_COMMANDS:\n"
        "    __import__(tandem.cli.main.COMMANDS[name][0])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'tandem')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    assert "tandem.loadgen.load" in loaded  # tandem bench's load generator, from the wheel
    namespaces = {m for m in loaded if m not in modules
                  and backend._module_path(backend.load_project().source_root, m) is None}
    assert loaded - namespaces <= set(modules), loaded - namespaces - set(modules)


def _package(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)


def _project(backend: ModuleType, root: Path, *ship: str) -> Any:
    return backend.Project(project={"name": "x", "version": "1"}, source_root=root,
                           ship=ship, refused=("torch", "pkg.server"))


def test_a_refused_import_anywhere_stops_the_build(backend: ModuleType, tmp_path: Path) -> None:
    _package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n",
                        "pkg/b.py": "def f():\n    import torch.nn\n"})  # a lazy import counts
    project = _project(backend, tmp_path, "pkg/**")
    with pytest.raises(backend.BuildError, match=r"pkg\.b <- pkg\.a imports torch\.nn"):
        backend.shipped_modules(project)
    (tmp_path / "pkg/b.py").write_text("from . import server\n")  # relative: resolved too
    (tmp_path / "pkg/server.py").write_text("")
    with pytest.raises(backend.BuildError, match=r"pkg\.b <- pkg\.a imports pkg\.server"):
        backend.shipped_modules(_project(backend, tmp_path, "pkg/__init__.py", "pkg/a.py",
                                         "pkg/b.py"))
    with pytest.raises(backend.BuildError, match=r"pkg/server\.py is selected .* refused"):
        backend.shipped_modules(project)  # a refused module selected by a glob
    (tmp_path / "pkg/b.py").write_text("from . import c\n")
    (tmp_path / "pkg/c.py").write_text("import os\n")
    project = _project(backend, tmp_path, "pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/c.py")
    assert set(backend.shipped_modules(project)) == {"pkg", "pkg.a", "pkg.b", "pkg.c"}


def test_an_import_of_ours_that_does_not_ship_stops_the_build(
    backend: ModuleType, tmp_path: Path
) -> None:
    """The globs select; the check proves the selection imports completely (relative imports
    and parent packages included), naming the chain from an entry point."""
    _package(tmp_path, {"pkg/__init__.py": "", "pkg/cli.py": "import pkg.sub.load\n",
                        "pkg/sub/__init__.py": "", "pkg/sub/load.py": "from . import stats\n",
                        "pkg/sub/stats.py": "import json\n", "pkg/other.py": ""})
    with pytest.raises(backend.BuildError,
                       match=r"pkg\.sub\.load <- pkg\.cli imports pkg\.sub\.stats, which does "
                             r"not ship"):
        backend.shipped_modules(_project(backend, tmp_path, "pkg/__init__.py", "pkg/cli.py",
                                         "pkg/sub/__init__.py", "pkg/sub/load.py"))
    with pytest.raises(backend.BuildError, match=r"pkg\.cli imports pkg\.sub, which does not"):
        backend.shipped_modules(_project(backend, tmp_path, "pkg/__init__.py", "pkg/cli.py",
                                         "pkg/sub/load.py", "pkg/sub/stats.py"))
    project = _project(backend, tmp_path, "pkg/__init__.py", "pkg/cli.py", "pkg/sub/**")
    assert set(backend.shipped_modules(project)) == {"pkg", "pkg.cli", "pkg.sub",
                                                     "pkg.sub.load", "pkg.sub.stats"}


def test_ship_globs_select_files_and_skip_build_leftovers(
    backend: ModuleType, tmp_path: Path
) -> None:
    _package(tmp_path, {"pkg/__init__.py": "", "pkg/py.typed": "", "pkg/a.py": "",
                        "pkg/deep/x/b.py": "", "pkg/deep/x/b.pyi": "",
                        "pkg/__pycache__/a.cpython-311.pyc": "", "pkg/deep/a.pyc": "",
                        "pkg/.hidden.py": "", "pkg/ab.py": ""})
    files = backend.shipped_files(_project(backend, tmp_path, "pkg/**"))
    assert files == ["pkg/__init__.py", "pkg/a.py", "pkg/ab.py", "pkg/deep/x/b.py",
                     "pkg/deep/x/b.pyi", "pkg/py.typed"]
    assert backend.shipped_files(_project(backend, tmp_path, "pkg/?.py", "pkg/__init__.py")) == [
        "pkg/__init__.py", "pkg/a.py"]
    assert backend.shipped_files(_project(backend, tmp_path, "pkg/**/*.pyi")) == [
        "pkg/deep/x/b.pyi"]
    with pytest.raises(backend.BuildError, match=r"'pkg/nope\.py' matches no file"):
        backend.shipped_files(_project(backend, tmp_path, "pkg/**", "pkg/nope.py"))


def _wheel_files(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_wheel_is_the_repositorys_files_with_lean_metadata(
    backend: ModuleType, serve: dict[str, Any], tmp_path: Path
) -> None:
    project = backend.load_project()
    files = _wheel_files(backend.write_wheel(project, tmp_path))
    info = "tandem_client-0.1.0.dist-info/"
    sources = {n: d for n, d in files.items() if not n.startswith(info)}
    assert sorted(sources) == backend.shipped_files(project)
    for name, data in sources.items():  # byte-identical: installing both in any order is safe
        assert (ROOT / name).read_bytes() == data, name
    assert {"tandem/py.typed", "tandem/protos/py.typed", "tandem/protos/v1/tandem_pb2.pyi"} <= set(
        sources)
    assert not [n for n in sources if "__pycache__" in n or n.endswith(".pyc")]
    # RECORD lists every other file with its sha256 and size.
    record = files[info + "RECORD"].decode().splitlines()
    assert len(record) == len(files)
    for line in record:
        name, digest, size = line.rsplit(",", 2)
        if name == info + "RECORD":
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=")
        assert (digest, int(size)) == (f"sha256={want.decode()}", len(files[name]))
    meta = files[info + "METADATA"].decode()
    required = [line.split(": ", 1)[1] for line in meta.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert required == ["grpcio>=1.85.1", "grpcio-health-checking>=1.85.1", "protobuf>=7.35.1"]
    every = {re.split(r"[<>=;\[ ]", line.split(": ", 1)[1])[0]
             for line in meta.splitlines() if line.startswith("Requires-Dist:")}
    assert every == {"grpcio", "grpcio-health-checking", "protobuf", "aiohttp", "tqdm",
                     "prometheus-client", "matplotlib", "pyyaml", "tandem-client"}
    # Same version and the same `tandem` entry point as tandem-serve.
    assert f"Version: {serve['project']['version']}" in meta
    assert serve["project"]["version"] == tandem.__version__
    scripts = serve["project"]["scripts"]
    assert files[info + "entry_points.txt"].decode() == "[console_scripts]\n" + "".join(
        f"{k} = {v}\n" for k, v in scripts.items())
    # Reproducible: a second build is the same bytes.
    again = tmp_path / "again"
    again.mkdir()
    assert _wheel_files(backend.write_wheel(project, again)) == files


def test_sdist_rebuilds_the_same_wheel(backend: ModuleType, tmp_path: Path) -> None:
    project = backend.load_project()
    wheel = _wheel_files(backend.write_wheel(project, tmp_path))
    sdist = backend.write_sdist(project, tmp_path)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    unpacked = tmp_path / "x" / "tandem_client-0.1.0"
    assert (unpacked / "PKG-INFO").is_file()
    rebuilt_project = backend.load_project(unpacked)
    assert rebuilt_project.source_root == unpacked
    out = tmp_path / "from-sdist"
    out.mkdir()
    assert _wheel_files(backend.write_wheel(rebuilt_project, out, unpacked)) == wheel


def test_tandem_serve_ships_every_client_file_too(
    backend: ModuleType, serve: dict[str, Any]
) -> None:
    """tandem-serve is the superset: its packages and package data cover the client's files,
    so an environment with both holds one copy of each, whichever came last."""
    include = serve["tool"]["setuptools"]["packages"]["find"]["include"]
    package_data = serve["tool"]["setuptools"]["package-data"]
    for name in backend.shipped_files(backend.load_project()):
        folder, _, filename = name.rpartition("/")
        package = folder.replace("/", ".")  # setuptools finds namespace packages too
        assert any(fnmatch(package, pattern) for pattern in include), name
        if not name.endswith(".py"):
            # package-data: {package: [patterns relative to its folder]}; a parent's may
            # reach into a subfolder ("tandem.protos": "v1/*.pyi").
            owners = [(p, pattern) for p, patterns in package_data.items()
                      for pattern in patterns
                      if name.startswith(p.replace(".", "/") + "/")]
            assert any(fnmatch(name[len(p) + 1:], pattern) for p, pattern in owners), name
