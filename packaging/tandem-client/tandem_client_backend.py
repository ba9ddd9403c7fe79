"""The PEP 517 build backend of ``tandem-client``: a wheel of the client's modules only.

Why a backend of our own: the client's sources are the repository's (tandem/, tandem/protos/,
tandem/common/, bench/, tandem/planner/), where they sit next to the server's modules in the same packages.
A setuptools project can only ship whole packages from below its own directory; this ships
exactly the modules the client imports, found by reading them:

    roots (pyproject [tool.tandem-client])
      -> every module of ours they import (at the top, in a function, under TYPE_CHECKING)
      -> and so on, plus each package's __init__.py, each module's .pyi stub, the data files

A module that imports a ``refused`` package (torch, ray, a server package, ...) anywhere
stops the build with the chain of imports that reached it. The wheel is pure Python
(py3-none-any), byte-for-byte the repository's files, reproducible (fixed timestamps, or
SOURCE_DATE_EPOCH). No build dependencies: it builds offline, with build isolation on.

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
    """The client cannot be built as configured (a refused import, a missing root, ...)."""


@dataclass(frozen=True, slots=True)
class Project:
    """What pyproject.toml says: [project] metadata and [tool.tandem-client]."""

    project: Mapping[str, Any]
    source_root: Path
    roots: tuple[str, ...]
    refused: frozenset[str]
    data: tuple[str, ...]

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
        roots=tuple(tool["roots"]),
        refused=frozenset(tool["refused"]),
        data=tuple(tool.get("data", ())),
    )


# --- which modules ship ---------------------------------------------------------------------


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


def _our_packages(root: Path) -> set[str]:
    return {p.parent.name for p in root.glob("*/__init__.py")}


def shipped_modules(project: Project) -> dict[str, Path]:
    """Module name -> file, for the roots and everything of ours they import, transitively.
    Raises BuildError on a missing root or a refused import (naming the chain)."""
    root = project.source_root
    ours = _our_packages(root)
    found: dict[str, Path] = {}
    parent: dict[str, str] = {}  # module -> the module that imported it (for errors)
    todo = list(project.roots)
    for name in todo:
        if _module_path(root, name) is None:
            raise BuildError(f"root {name!r} is not a module under {root}")

    def chain(module: str) -> str:
        links = [module]
        while links[-1] in parent:
            links.append(parent[links[-1]])
        return " <- ".join(links)

    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _module_path(root, module)
        assert path is not None
        found[module] = path
        parts = module.split(".")
        imports = {".".join(parts[:i]) for i in range(1, len(parts))}  # parent packages
        imports |= _imported_names(module, path)
        for name in sorted(imports):
            top = name.partition(".")[0]
            if top in project.refused:
                raise BuildError(f"{chain(module)} imports {name} (refused in a client)")
            if top in ours and name not in found and _module_path(root, name) is not None:
                parent.setdefault(name, module)
                todo.append(name)
    return dict(sorted(found.items()))


def shipped_files(project: Project) -> list[str]:
    """Paths (relative to the source root, '/'-separated) of every file the wheel holds."""
    root = project.source_root
    files = set()
    for path in shipped_modules(project).values():
        files.add(path.relative_to(root).as_posix())
        stub = path.with_suffix(".pyi")
        if stub.is_file():
            files.add(stub.relative_to(root).as_posix())
    for name in project.data:
        if not (root / name).is_file():
            raise BuildError(f"data file {name!r} is not under {root}")
        files.add(name)
    return sorted(files)


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
    """``python tandem_client_backend.py [--modules]``: list what the wheel ships."""
    project = load_project()
    items: Iterable[str] = (shipped_modules(project) if "--modules" in argv
                            else shipped_files(project))
    print("\n".join(items))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
