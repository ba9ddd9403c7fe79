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
    tandem up      the same sizes, each worker one Ray actor holding its N devices (N GPUs,
                   or N CPU shares), which starts its N rank processes as tandem decode
                   --tensor-parallel-size N does; a rank that dies ends the actor and Ray
                   restarts the group whole (tandem/launcher/pool.py has why)
"""

from __future__ import annotations

from collections.abc import Sequence

FLAG = "--tensor-parallel-size"
KV_DTYPE = "--kv-cache-dtype"


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
    role_sizes(worker_args, prefill_args, decode_args, num_prefill)


def role_sizes(worker_args: Sequence[str], prefill_args: Sequence[str],
               decode_args: Sequence[str], num_prefill: int,
               cuda: bool = False) -> tuple[int, int]:
    """(prefill, decode) group sizes, checked as :func:`check_local` says (ValueError); the
    prefill size is 1 when there are no prefill workers. ``cuda``: both roles run on CUDA,
    where "auto" is the model's dtype in one process and in a group alike."""
    sizes = [group_size(worker_args, role_args)
             for role_args in ((prefill_args,) if num_prefill else ()) + (decode_args,)]
    if min(sizes) < 1:
        raise ValueError(f"{FLAG} must be >= 1")
    if len(set(sizes)) > 1 and not cuda and not all(
            _has(KV_DTYPE, worker_args, role_args) for role_args in (prefill_args, decode_args)):
        raise ValueError(
            f"prefill workers of {FLAG} {sizes[0]} and decode workers of {sizes[1]} need "
            f"{KV_DTYPE} given (e.g. {KV_DTYPE} float32): 'auto' picks float16 for one "
            "process on the CPU and the model's dtype for a group, and their KV cannot move "
            "between caches of two dtypes")
    return (sizes[0] if num_prefill else 1), sizes[-1]


def _has(flag: str, *argvs: Sequence[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for argv in argvs for a in argv)
