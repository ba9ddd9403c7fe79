"""tandem/launcher/up_state.py: the file ``tandem up`` leaves for ``tandem down``: private,
read as untrusted input, and a stale one (its ``tandem up`` gone with its Ray) means nothing
runs (no Ray started)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.launcher import up_state
from tandem.launcher.up_state import UpState, UpStateError


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "tandem"


def _mine(namespace: str = "tandem", owns_ray: bool = True) -> UpState:
    return UpState.of_this_process(namespace, "127.0.0.1:6379", owns_ray)


def test_written_privately_and_read_back(runtime_dir: Path) -> None:
    state = _mine()
    path = up_state.write(state)
    assert path == runtime_dir / "up-tandem.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert runtime_dir.stat().st_mode & 0o777 == 0o700
    assert up_state.read("tandem") == state
    assert state.alive() and state.pid == os.getpid() and state.pid_start > 0
    assert up_state.read("other") is None


def test_home_cache_without_a_runtime_dir(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert up_state.runtime_dir() == tmp_path / ".cache" / "tandem" / "run"


def test_an_odd_namespace_goes_by_its_hash() -> None:
    path = up_state.state_path("../../etc/x")
    assert path.parent == up_state.runtime_dir() and "/" not in path.name[3:]
    assert path != up_state.state_path("../../etc/y")


def test_a_reused_pid_is_not_the_tandem_up_that_wrote_it() -> None:
    state = _mine()
    later = UpState(state.pid, state.pid_start + 1, "tandem", state.address, True)
    assert not later.alive()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert up_state.process_start(child.pid) == 0  # reaped: gone


@pytest.mark.parametrize("text, why", [
    ("not json", "not a tandem up state file"),
    ("[1, 2]", "not a JSON object"),
    ('{"pid": "1"}', "'pid' is not a int"),
])
def test_a_malformed_file_is_refused_with_its_reason(runtime_dir: Path, text: str,
                                                     why: str) -> None:
    runtime_dir.mkdir(mode=0o700)
    path = runtime_dir / "up-tandem.json"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(UpStateError, match=why):
        up_state.read("tandem")


def test_a_file_others_can_touch_or_for_another_namespace_is_refused(
        runtime_dir: Path) -> None:
    path = up_state.write(_mine())
    path.chmod(0o644)
    with pytest.raises(UpStateError, match="mode 644"):
        up_state.read("tandem")
    path.chmod(0o600)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "namespace": "other"}))
    with pytest.raises(UpStateError, match="names namespace 'other'"):
        up_state.read("tandem")
    path.write_text(json.dumps({**raw, "address": "nowhere"}))
    with pytest.raises(UpStateError, match="not HOST:PORT"):
        up_state.read("tandem")
    path.unlink()
    path.symlink_to(runtime_dir / "elsewhere.json")
    with pytest.raises(UpStateError, match="cannot open"):
        up_state.read("tandem")


def test_dial_target_prefers_the_address_given_then_the_file_then_auto() -> None:
    assert up_state.dial_target("10.0.0.1:6379", "tandem") == ("10.0.0.1:6379", None)
    assert up_state.dial_target(None, "tandem") == ("auto", None)
    state = _mine()
    up_state.write(state)
    assert up_state.dial_target(None, "tandem") == ("127.0.0.1:6379", state)


def test_a_stale_file_means_nothing_runs_and_goes() -> None:
    mine = _mine()
    gone = UpState(mine.pid, mine.pid_start + 1, "tandem", mine.address, owns_ray=True)
    up_state.write(gone)
    assert up_state.dial_target(None, "tandem") == (None, gone)
    assert up_state.read("tandem") is None
    # A detached cluster on a Ray cluster of its own outlives the tandem up that started it,
    # as long as something answers at its address.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        detached = UpState(mine.pid, mine.pid_start + 1, "tandem", address, owns_ray=False)
        up_state.write(detached)
        assert up_state.dial_target(None, "tandem") == (address, detached)
    assert up_state.dial_target(None, "tandem") == (None, detached)  # closed: stale
    assert up_state.read("tandem") is None


def test_remove_with_a_pid_leaves_another_writers_file() -> None:
    up_state.write(_mine())
    up_state.remove("tandem", os.getpid() + 1)
    assert up_state.read("tandem") is not None
    up_state.remove("tandem", os.getpid())
    assert up_state.read("tandem") is None
    up_state.remove("tandem")  # nothing there: nothing to do


def test_dial_env_sets_rays_authentication_as_up_had_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    UpState(1, 0, "tandem", "127.0.0.1:1", True, "token", "/run/t").dial_env()
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == "/run/t"
