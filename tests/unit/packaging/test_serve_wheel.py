"""tandem-serve (the repository's pyproject.toml) installs one import name, ``tandem``: what
setuptools' package discovery finds with the project's own settings is the namespace and
nothing of the lab (bench/, scripts/, tests/), and the non-Python files the code reads at run
time (the native kernels' sources, the protos) are package data."""

from __future__ import annotations

import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[3]

if sys.version_info < (3, 11):
    pytest.skip("reads pyproject.toml with tomllib", allow_module_level=True)
import tomllib  # noqa: E402


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_wheel_holds_the_tandem_namespace_alone() -> None:
    include = _setuptools()["packages"]["find"]["include"]
    found = find_packages(where=str(ROOT), include=include)
    assert {p.split(".")[0] for p in found} == {"tandem"}, found
    # and every package under tandem/ is found (an __init__.py each: none is left behind)
    on_disk = {str(d.relative_to(ROOT)).replace("/", ".")
               for d in (ROOT / "tandem").rglob("*") if d.is_dir() and any(d.glob("*.py"))}
    assert on_disk <= set(found), on_disk - set(found)


def test_the_files_read_at_run_time_are_package_data() -> None:
    data = _setuptools()["package-data"]

    def shipped(path: Path) -> bool:
        rel = path.relative_to(ROOT / "tandem")
        for package, patterns in data.items():
            base = Path(*package.split(".")[1:])
            if rel.is_relative_to(base) and any(fnmatch(str(rel.relative_to(base)), p)
                                                for p in patterns):
                return True
        return False

    needed = [*(ROOT / "tandem" / "engine" / "native").glob("*.[ch]*"),
              *(ROOT / "tandem" / "protos" / "v1").glob("*.proto"), ROOT / "tandem" / "py.typed"]
    assert needed and all(shipped(p) for p in needed if p.suffix != ".py"), \
        [str(p) for p in needed if p.suffix != ".py" and not shipped(p)]
