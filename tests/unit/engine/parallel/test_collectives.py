"""The group's collectives end on their own (tandem/engine/parallel/collectives.py): two real
processes form a gloo group over a private rendezvous directory; when one stops taking part
(it hangs, alive, never calling the collective), the other's all-reduce raises once the
group's timeout passes instead of waiting forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]  # this checkout: ``-c`` imports tandem from here
RANK = textwrap.dedent("""
    import sys, time, torch
    from tandem.engine.parallel.collectives import AllReduce, join, leave
    rank, store = int(sys.argv[1]), sys.argv[2]
    print("imported", flush=True)
    sys.stdin.readline()  # both ranks join once both are ready: the 3 s bound is the group's
    join(store, rank, 2, "cpu", timeout_s=3.0)
    layer = AllReduce(torch.nn.Identity())
    print("sum", layer(torch.full((3,), float(rank + 1))).tolist(), flush=True)
    if rank == 1:
        sys.stdin.read()  # hangs, alive, until the test closes its stdin
        sys.exit(0)
    started = time.monotonic()
    try:
        layer(torch.ones(3))
    except RuntimeError as exc:
        print(f"raised after {time.monotonic() - started:.1f}s", flush=True)
        sys.exit(0)
    sys.exit(1)
""")


def test_an_all_reduce_whose_peer_hangs_raises_after_the_timeout(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(store)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    leader, hung = ranks
    try:
        # Importing torch may take longer than the group's timeout on a busy host: the
        # ranks are told to join only once both have.
        for proc in ranks:
            assert proc.stdout.readline() == "imported\n"  # type: ignore[union-attr]
        for proc in ranks:
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        out, err = leader.communicate(timeout=300)
        assert leader.returncode == 0, err[-2000:]
        lines = out.splitlines()
        assert lines[0] == "sum [3.0, 3.0, 3.0]"  # the group worked while both took part
        assert lines[1].startswith("raised after")
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait(timeout=60)
        hung.stdin.close()  # type: ignore[union-attr]
        hung.wait(timeout=60)
    assert hung.stdout.read().startswith("sum [3.0, 3.0, 3.0]")  # type: ignore[union-attr]
