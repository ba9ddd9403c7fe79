"""What the launchers allow of ``--tensor-parallel-size`` (vLLM's flag), role by role.

A worker's group size is the last ``--tensor-parallel-size`` among the flags it is given: the
forwarded engine flag, ``--worker-arg``, then its role's ``--prefill-arg``/``--decode-arg``.

    tandem local   a tensor-parallel worker serves colocated (--no-prefill: it prefills its
                   own prompts); a prefill worker, or a decode worker that prefill workers
                   would push KV into, refuses a group until the group's KV handoff is built
    tandem up      places one process per worker: a group (N ranks, one Ray placement group
                   of N devices) is refused until that placement is built
"""

from __future__ import annotations

from collections.abc import Sequence

FLAG = "--tensor-parallel-size"

PREFILL_REFUSED = (
    "--tensor-parallel-size > 1 on a prefill worker needs the KV handoff of a tensor-parallel "
    "group, which is not built yet: run the tensor-parallel worker colocated (a decode "
    "worker that prefills itself: tandem local --no-prefill)")
DECODE_PUSH_REFUSED = (
    "a decode worker with --tensor-parallel-size > 1 takes no KV pushed by prefill workers "
    "yet (each rank holds its own KV heads): add --no-prefill (colocated)")
UP_REFUSED = (
    "tandem up does not place tensor-parallel workers yet (a group of N ranks as one Ray "
    "placement group of N devices): use tandem local --no-prefill --tensor-parallel-size N, "
    "or start tandem decode --tensor-parallel-size N yourself")


def group_size(*argvs: Sequence[str]) -> int:
    """The last ``--tensor-parallel-size`` given across ``argvs`` (in order), else 1;
    ValueError when its value is not an integer."""
    size = "1"
    for argv in argvs:
        items = list(argv)
        for i, item in enumerate(items):
            if item == FLAG and i + 1 < len(items):
                size = items[i + 1]
            elif item.startswith(FLAG + "="):
                size = item.split("=", 1)[1]
    try:
        return int(size)
    except ValueError:
        raise ValueError(f"{FLAG} must be an integer, got {size!r}") from None


def check_local(worker_args: Sequence[str], prefill_args: Sequence[str],
                decode_args: Sequence[str], num_prefill: int) -> None:
    """ValueError when ``tandem local`` would start a tensor-parallel worker that cannot
    serve in this cluster (see the module docstring)."""
    if num_prefill == 0:
        return
    if group_size(worker_args, prefill_args) > 1:
        raise ValueError(PREFILL_REFUSED)
    if group_size(worker_args, decode_args) > 1:
        raise ValueError(DECODE_PUSH_REFUSED)


def check_up(worker_args: Sequence[str], prefill_args: Sequence[str],
             decode_args: Sequence[str]) -> None:
    """ValueError when ``tandem up`` is asked for a tensor-parallel worker."""
    if group_size(worker_args, prefill_args) > 1 or group_size(worker_args, decode_args) > 1:
        raise ValueError(UP_REFUSED)
