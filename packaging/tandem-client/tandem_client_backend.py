"""The PEP 517 build backend of ``tandem-client``: a wheel of the client's files only.

Why a backend of our own: the client's sources are the repository's (tandem/sdk, tandem/protos,
the client commands in tandem/cli, tandem/loadgen, a few tandem/common modules), where they
sit next to the server's modules in the same ``tandem`` package. A setuptools project can only
ship whole packages from below its own directory; this ships exactly the files that
pyproject's [tool.tandem-client] ``ship`` globs select (``**`` any depth; caches and hidden
files never), and checks them before it writes anything:

    every module of ours a shipped module imports (at the top, in a function, under
    TYPE_CHECKING; its parent packages too) ships as well: the client imports completely
    no shipped module imports a ``refused`` package (torch, ray, tandem.engine, ...)

Either failure stops the build, naming the chain of imports from an entry point to the
offending import, so a new import in a client module cannot quietly pull the server in or
leave the client broken. The wheel is pure Python (py3-none-any), byte-for-byte the
repository's files, reproducible (fixed timestamps, or SOURCE_DATE_EPOCH). No build
dependencies: it builds offline, with build isolation on.

Hooks: build_wheel, build_sdist, prepare_metadata_for_build_wheel, get_requires_for_*. The
sdist carries the shipped sources next to this file (its pyproject says source-root ".").
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # get_requires_for_build_* asks for it on 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
_EPOCH_1980 = 315532800  # the earliest time a zip entry can hold


class BuildError(RuntimeError):
    """The client cannot be built as configured (a refused or unshipped import, a glob that
    matches nothing, ...)."""


@dataclass(frozen=True, slots=True)
class Project:
    """What pyproject.toml says: [project] metadata and [tool.tandem-client]."""

    project: Mapping[str, Any]
    source_root: Path
    ship: tuple[str, ...]
    refused: tuple[str, ...]

    @property
    def name(self) -> str:
        return str(self.project["name"])

    @property
    def version(self) -> str:
        return str(self.project["version"])

    @property
    def dist(self) -> str:
        """The name as wheel and sdist file names spell it (tandem_client)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()


def load_project(directory: Path = HERE) -> Project:
    """The project described by ``directory``/pyproject.toml."""
    data = tomllib.loads((directory / "pyproject.toml").read_text())
    tool = data["tool"]["tandem-client"]
    return Project(
        project=data["project"],
        source_root=(directory / tool["source-root"]).resolve(),
        ship=tuple(tool["ship"]),
        refused=tuple(tool["refused"]),
    )


# --- which files ship: the `ship` globs ---------------------------------------------------


def _never_shipped(name: str) -> bool:
    """Build leftovers and hidden files, which no glob ships."""
    return name.startswith(".") or name == "__pycache__" or name.endswith((".pyc", ".pyo"))


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` ('/'-separated; ``**`` any number of folders, ``*`` and ``?`` within one
    name) as a regular expression over '/'-separated relative paths."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _files_under(root: Path, folder: str) -> Iterable[str]:
    """Every file below ``root``/``folder`` (relative, '/'-separated), leftovers skipped."""
    for dirpath, dirnames, filenames in os.walk(root / folder):
        dirnames[:] = sorted(d for d in dirnames if not _never_shipped(d))
        for name in filenames:
            if not _never_shipped(name):
                yield (Path(dirpath) / name).relative_to(root).as_posix()


def _glob(root: Path, pattern: str) -> set[str]:
    """The files under ``root`` that ``pattern`` matches."""
    parts = pattern.split("/")
    literal = []
    for part in parts:
        if any(c in part for c in "*?"):
            break
        literal.append(part)
    if len(literal) == len(parts):  # no wildcard: one file
        return {pattern} if (root / pattern).is_file() else set()
    regex = _glob_regex(pattern)
    return {f for f in _files_under(root, "/".join(literal)) if regex.match(f)}


def _module_name(path: str) -> str | None:
    """``tandem/cli/main.py`` -> ``tandem.cli.main``, a package's __init__.py -> the package;
    None for a file that is not a module."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _refused_by(name: str, refused: Iterable[str]) -> str | None:
    """The ``refused`` entry that covers the dotted ``name`` (itself or a parent), or None."""
    return next((r for r in refused if name == r or name.startswith(r + ".")), None)


def _shipped_paths(project: Project) -> list[str]:
    """The files the ``ship`` globs select; BuildError for a glob that matches nothing."""
    files: set[str] = set()
    for pattern in project.ship:
        matched = _glob(project.source_root, pattern)
        if not matched:
            raise BuildError(f"ship pattern {pattern!r} matches no file under "
                             f"{project.source_root}")
        files |= matched
    return sorted(files)


# --- the check: what ships imports only what ships ---------------------------------------


def _module_path(root: Path, module: str) -> Path | None:
    """The file of ``module`` under ``root`` (a package's __init__.py), or None."""
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name ``module`` imports, anywhere in it (relative imports resolved);
    ``from a.b import c`` gives both ``a.b`` and ``a.b.c`` (c may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def _chains(graph: Mapping[str, set[str]]) -> dict[str, str]:
    """For each module, the shortest chain of shipped imports reaching it from a module that
    no shipped module imports (an entry point: ``tandem``, the CLI), as "m <- importer <- ..."."""
    imported = set().union(*graph.values()) if graph else set()
    via: dict[str, str | None] = {m: None for m in sorted(graph) if m not in imported}
    todo = list(via)
    for module in todo:  # breadth first: todo grows as modules are reached
        for name in sorted(graph[module]):
            if name not in via:
                via[name] = module
                todo.append(name)
    out = {}
    for module in graph:
        links = [module]
        while (importer := via.get(links[-1])) is not None:  # a tree: every link reached once
            links.append(importer)
        out[module] = " <- ".join(links)
    return out


def shipped_modules(project: Project) -> dict[str, Path]:
    """Module name -> file, for every module the wheel ships.

    Raises BuildError, naming the chain of imports from an entry point, when a shipped
    module imports a ``refused`` package (at the top, in a function, under TYPE_CHECKING),
    or a module of the shipped packages that does not ship (the closure is incomplete: the
    client would fail to import it), or when a refused module is itself selected."""
    root = project.source_root
    files = _shipped_paths(project)
    modules = {m: root / f for f in files if (m := _module_name(f)) is not None}
    tops = {m.partition(".")[0] for m in modules}
    graph: dict[str, set[str]] = {}
    problems: dict[str, list[str]] = {}
    for module, path in modules.items():
        if (entry := _refused_by(module, project.refused)) is not None:
            raise BuildError(f"{path.relative_to(root).as_posix()} is selected by `ship` but "
                             f"{entry} is refused in a client")
        parts = module.split(".")
        names = {".".join(parts[:i]) for i in range(1, len(parts))}  # parent packages
        names |= _imported_names(module, path)
        graph[module] = set()
        for name in sorted(names):
            if (entry := _refused_by(name, project.refused)) is not None:
                problems.setdefault(module, []).append(f"{name} (refused in a client)")
            elif name in modules:
                graph[module].add(name)
            elif name.partition(".")[0] in tops and _module_path(root, name) is not None:
                problems.setdefault(module, []).append(f"{name}, which does not ship")
    if problems:
        chains = _chains(graph)
        raise BuildError("\n".join(f"{chains[m]} imports {what}"
                                    for m in sorted(problems) for what in problems[m]))
    return dict(sorted(modules.items()))


def shipped_files(project: Project) -> list[str]:
    """Paths (relative to the source root, '/'-separated) of every file the wheel holds,
    after checking its modules (``shipped_modules``)."""
    shipped_modules(project)
    return _shipped_paths(project)


# --- metadata -------------------------------------------------------------------------------


def _with_extra(requirement: str, extra: str) -> str:
    spec, _, marker = requirement.partition(";")
    condition = f'extra == "{extra}"'
    if marker.strip():
        condition = f"({marker.strip()}) and {condition}"
    return f"{spec.strip()}; {condition}"


def metadata(project: Project, directory: Path = HERE) -> str:
    """The METADATA (and sdist PKG-INFO) text, core metadata 2.1."""
    p = project.project
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project.name}",
        f"Version: {project.version}",
        f"Summary: {p.get('description', '')}",
    ]
    if "license" in p:
        lines.append(f"License: {p['license']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Requires-Dist: {r}" for r in p.get("dependencies", ())]
    for extra, requirements in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {_with_extra(r, extra)}" for r in requirements]
    readme = p.get("readme")
    if not readme:
        return "\n".join(lines) + "\n"
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (directory / readme).read_text()


def _dist_info_files(project: Project, directory: Path, files: Sequence[str]) -> dict[str, bytes]:
    scripts = project.project.get("scripts", {})
    entry_points = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    wheel = ("Wheel-Version: 1.0\nGenerator: tandem_client_backend\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n")
    tops = sorted({f.partition("/")[0] for f in files})
    return {
        "METADATA": metadata(project, directory).encode(),
        "WHEEL": wheel.encode(),
        "entry_points.txt": entry_points.encode(),
        "top_level.txt": "".join(f"{t}\n" for t in tops).encode(),
    }


# --- archives -------------------------------------------------------------------------------


def _timestamp() -> int:
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", _EPOCH_1980)), _EPOCH_1980)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(project: Project, out_dir: Path, directory: Path = HERE) -> Path:
    """Build the wheel into ``out_dir``; returns its path."""
    dist_info = f"{project.dist}-{project.version}.dist-info"
    files = shipped_files(project)
    entries = [(name, (project.source_root / name).read_bytes()) for name in files]
    entries += [(f"{dist_info}/{n}", d)
                for n, d in _dist_info_files(project, directory, files).items()]
    record = [_record_line(n, d) for n, d in entries] + [f"{dist_info}/RECORD,,"]
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    out = out_dir / f"{project.dist}-{project.version}-py3-none-any.whl"
    stamp = time.gmtime(_timestamp())[:6]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out


def write_sdist(project: Project, out_dir: Path, directory: Path = HERE) -> Path:
    """Build the sdist into ``out_dir``: this directory's files plus the shipped sources, its
    pyproject's source-root rewritten to "."; returns its path."""
    base = f"{project.dist}-{project.version}"
    pyproject = re.sub(r'(?m)^source-root\s*=.*$', 'source-root = "."',
                       (directory / "pyproject.toml").read_text())
    members: list[tuple[str, bytes]] = [
        ("pyproject.toml", pyproject.encode()),
        (Path(__file__).name, Path(__file__).read_bytes()),
        ("PKG-INFO", metadata(project, directory).encode()),
    ]
    readme = project.project.get("readme")
    if readme:
        members.append((readme, (directory / readme).read_bytes()))
    members += [(n, (project.source_root / n).read_bytes()) for n in shipped_files(project)]
    out = out_dir / f"{base}.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members):
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mtime, info.mode = len(data), _timestamp(), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


# --- PEP 517 hooks --------------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return [] if sys.version_info >= (3, 11) else ["tomli>=1.1"]


def get_requires_for_build_sdist(config_settings: Mapping[str, Any] | None = None) -> list[str]:
    return get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    project = load_project()
    name = f"{project.dist}-{project.version}.dist-info"
    target = Path(metadata_directory) / name
    target.mkdir(parents=True, exist_ok=True)
    for filename, data in _dist_info_files(project, HERE, shipped_files(project)).items():
        (target / filename).write_bytes(data)
    return name


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    return write_wheel(load_project(), Path(wheel_directory)).name


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    return write_sdist(load_project(), Path(sdist_directory)).name


def _main(argv: Sequence[str]) -> int:
    """``python tandem_client_backend.py [--modules]``: check and list what the wheel ships."""
    project = load_project()
    items: Iterable[str] = (shipped_modules(project) if "--modules" in argv
                            else shipped_files(project))
    print("\n".join(items))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
