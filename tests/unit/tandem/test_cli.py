"""The ``tandem`` dispatcher offers the commands whose modules are installed, and says what to
install when a command or an optional package is missing (a ``tandem-client`` environment:
a package set to None in ``sys.modules`` is one that the import system reports absent)."""

from __future__ import annotations

import sys

import pytest

from tandem.cli import main as cli


def test_every_command_is_installed_in_the_full_distribution(capsys) -> None:
    assert all(cli.installed(name) for name in cli.COMMANDS)
    assert set(cli.CLIENT_COMMANDS) <= set(cli.COMMANDS)
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in cli.COMMANDS)
    assert "tandem-serve" not in out


def test_a_server_command_without_its_package_names_tandem_serve(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delitem(sys.modules, "tandem.router.cli", raising=False)  # loaded by another test
    monkeypatch.setitem(sys.modules, "tandem.router", None)  # as in a client-only environment
    assert not cli.installed("router")
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "\n  router " not in out and "(pip install tandem-serve): router" in out
    assert cli.main(["router", "--port", "0"]) == 2
    assert "pip install tandem-serve" in capsys.readouterr().err


def test_a_missing_optional_package_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delitem(sys.modules, "tandem.cli.bench", raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert cli.main(["bench", "--help"]) == 1
    assert "pip install tqdm (with tandem-client: pip install 'tandem-client[bench]')" in (
        capsys.readouterr().err)
    assert not cli.has_package("tqdm")


def test_a_missing_package_of_ours_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the known optional packages get the friendly line; anything else is a real bug.
    monkeypatch.delitem(sys.modules, "tandem.cli.generate", raising=False)
    monkeypatch.setitem(sys.modules, "tandem.common.arg_parser", None)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["generate", "--help"])
