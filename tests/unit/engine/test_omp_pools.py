"""tandem/engine/omp_pools.py: the calling thread's OpenMP pool ends, other threads keep theirs.

Each case runs in a fresh interpreter: a pool is per-thread, process-wide state, and the test
process's own main thread must keep its torch threads.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, threading, time
    import torch
    from tandem.engine.omp_pools import release_this_threads_pool

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def wait_for(pred, what):
        deadline = time.monotonic() + 10.0
        while not pred():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}: {tasks()} threads")
            time.sleep(0.01)

    torch.set_num_threads(2)
    base = tasks()
    x = torch.ones(4_000_000)
    (x * 2).sum()  # a parallel op: this thread's pool gets its helper
    assert tasks() == base + 1, (base, tasks())
    assert release_this_threads_pool()
    wait_for(lambda: tasks() == base, "the helper to exit")
    assert torch.get_num_threads() == 1  # this thread's later ops: one thread, no pool
    (x * 2).sum()
    assert tasks() == base, (base, tasks())

    seen = []
    def engine_thread():  # another thread keeps torch's count and gets its own pool
        seen.append(torch.get_num_threads())
        (x * 2).sum()
        seen.append(tasks())
    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen == [2, base + 2], (seen, base)  # itself and its one helper
    print("ok")
""")


def test_release_ends_the_calling_threads_pool_only() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok")
