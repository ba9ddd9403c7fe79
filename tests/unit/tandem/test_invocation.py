"""tandem/cli/invocation.py: the printed command runs when pasted, on PATH or not."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.cli import invocation


def test_the_printed_command_runs_tandem_from_this_installation() -> None:
    cmd = shlex.split(invocation.tandem_command()) + ["--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "usage: tandem <command>" in out.stdout


def test_without_tandem_on_path_it_names_the_venv_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invocation.shutil, "which", lambda _: None)
    here = Path(sys.executable).parent / "tandem"
    if here.exists():
        assert Path(shlex.split(invocation.tandem_command())[0]).resolve() == here.resolve()
    else:
        assert invocation.tandem_command().endswith("-m tandem.cli.main")


def test_with_no_script_at_all_it_falls_back_to_python_m(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setattr(invocation.shutil, "which", lambda _: None)
    monkeypatch.setattr(invocation.sys, "executable", str(tmp_path / "python"))
    assert invocation.tandem_command() == f"{tmp_path / 'python'} -m tandem.cli.main"
