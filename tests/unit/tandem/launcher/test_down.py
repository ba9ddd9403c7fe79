"""``tandem down`` without ``--address``: a state file whose ``tandem up`` has ended with its
own Ray instance means nothing runs (said, the file removed, no Ray dialled); one that cannot
be trusted is refused with its reason (no Ray started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tandem.launcher import down, up_state
from tandem.launcher.up_state import UpState


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "tandem"


def test_a_tandem_up_gone_with_its_ray_means_nothing_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    mine = UpState.of_this_process("ns", "127.0.0.1:1", owns_ray=True)
    up_state.write(UpState(mine.pid, mine.pid_start + 1, "ns", "127.0.0.1:1", True))
    ray_before = "ray" in sys.modules
    assert down.main(["--namespace", "ns"]) == 1
    assert "has ended" in capsys.readouterr().err
    assert up_state.read("ns") is None
    assert ("ray" in sys.modules) == ray_before  # nothing dialled


def test_an_untrusted_state_file_is_refused(runtime_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = up_state.write(UpState.of_this_process("ns", "127.0.0.1:1", owns_ray=True))
    path.chmod(0o666)
    assert down.main(["--namespace", "ns"]) == 2
    err = capsys.readouterr().err
    assert "should be 0600" in err and "pass --address" in err
    assert path.exists()  # not ours to judge further: left as it is
