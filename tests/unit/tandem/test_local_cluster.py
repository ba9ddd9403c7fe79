"""tandem/launcher/local_cluster.py: the cluster's processes keep their temporary files in a private
folder that ``stop`` removes, so a worker killed with SIGKILL leaves no socket behind."""

from __future__ import annotations

import stat
from pathlib import Path

from tandem.launcher.local_cluster import Cluster


def test_a_killed_process_leaves_no_socket_after_stop() -> None:
    cluster = Cluster()
    try:
        scratch = cluster.scratch
        assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
        proc = cluster.start("tests.unit.tandem.leaves_a_socket", timeout=60)
        path = Path(proc.info["path"])
        assert path.parent == scratch
        proc.kill()
        assert path.is_socket()  # SIGKILL: nothing unlinked it
    finally:
        cluster.stop()
    assert not path.exists() and not scratch.exists()


def test_a_cluster_started_again_after_stop_gets_a_new_folder() -> None:
    cluster = Cluster()
    try:
        first = cluster.scratch
        cluster.stop()
        assert not first.exists()
        second = cluster.scratch
        assert second != first and second.is_dir()
    finally:
        cluster.stop()
    assert not second.exists()
