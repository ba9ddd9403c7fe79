"""The design map's import rules ([tool.importlinter] in pyproject.toml) hold: ``lint-imports``
over this checkout, its report the failure message (each broken contract with the import
chain that breaks it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# lint-imports' command line (the console script is this click command).
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_import_contracts_hold() -> None:
    out = subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"lint-imports failed:\n{out.stdout}\n{out.stderr}"
    assert "0 broken" in out.stdout, out.stdout


def test_every_package_has_a_contract() -> None:
    """A new package under tandem/ gets its rules when it is added: each one is the subject
    of some contract (its sources, independent modules or protected modules)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    subjects = set()
    for contract in config["contracts"]:
        for key in ("source_modules", "modules", "protected_modules"):
            subjects.update(contract.get(key, ()))
    packages = {f"tandem.{p.parent.name}" for p in (ROOT / "tandem").glob("*/__init__.py")}
    assert packages <= subjects, f"no contract in [tool.importlinter]: {packages - subjects}"
