"""What the launchers allow of ``--tensor-parallel-size`` (vLLM's flag), role by role.

A worker's group size is the last ``--tensor-parallel-size`` among the flags it is given: the
forwarded engine flag, ``--worker-arg``, then its role's ``--prefill-arg``/``--decode-arg``.

    tandem local   any size per role (--prefill-arg=--tensor-parallel-size=A
                   --decode-arg=--tensor-parallel-size=B): each rank of a prefill group
                   pushes its KV heads to the decode ranks that hold them, whatever the two
                   sizes (tandem/kv_transfer/reshard.py); the model must split over each.
                   Roles of different sizes need a --kv-cache-dtype given: "auto" stores
                   float16 in one process on the CPU (its native kernels) and the model's
                   dtype in a group, and caches of two dtypes cannot exchange blocks
    tandem up      places one process per worker: a group (N ranks, one Ray placement group
                   of N devices) is refused until that placement is built
"""

from __future__ import annotations

from collections.abc import Sequence

FLAG = "--tensor-parallel-size"
KV_DTYPE = "--kv-cache-dtype"

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
    """ValueError when a role's ``--tensor-parallel-size`` is not a positive integer (whether
    the model splits over it, each worker checks before any rank starts)."""
    sizes = [group_size(worker_args, role_args)
             for role_args in ((prefill_args,) if num_prefill else ()) + (decode_args,)]
    if min(sizes) < 1:
        raise ValueError(f"{FLAG} must be >= 1")
    if len(set(sizes)) > 1 and not all(
            _has(KV_DTYPE, worker_args, role_args) for role_args in (prefill_args, decode_args)):
        raise ValueError(
            f"prefill workers of {FLAG} {sizes[0]} and decode workers of {sizes[1]} need "
            f"{KV_DTYPE} given (e.g. {KV_DTYPE} float32): 'auto' picks float16 for one "
            "process on the CPU and the model's dtype for a group, and their KV cannot move "
            "between caches of two dtypes")


def _has(flag: str, *argvs: Sequence[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for argv in argvs for a in argv)


def check_up(worker_args: Sequence[str], prefill_args: Sequence[str],
             decode_args: Sequence[str]) -> None:
    """ValueError when ``tandem up`` is asked for a tensor-parallel worker."""
    if group_size(worker_args, prefill_args) > 1 or group_size(worker_args, decode_args) > 1:
        raise ValueError(UP_REFUSED)
