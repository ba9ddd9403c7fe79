"""Ranks 1..N-1 of a tensor-parallel group: run every forward rank 0 runs, on this rank's shard.

    python -m tandem.engine.parallel.follower REPLY_FD   (spawned by group.RankGroup only)

    stdin: init ──> join the process group ──> load this rank's shard (its routed experts
           only, under expert parallelism)
           [memory ──> this rank's device's free and total bytes (rank 0 sizes the pool)]
           runner ──> build the model runner and its KV cache (this rank's KV heads) ──> ready
           step | copy ... (each the forward or block copy rank 0 runs) ... stop ──> exit 0
           lora_load | lora_unload (an adapter rank 0 checked: this rank holds its cut, or
               drops it) ──> done {of, error} on the reply pipe

A follower never samples: the lm_head is replicated and rank 0 computes the logits. A step
under LoRA adapters runs with its rows' adapters, as on rank 0 (tandem/engine/lora/manager.py).
An adapter this rank cannot hold (over its adapter slots, short of memory, an error cutting
it) is answered with the reason, and the rank serves on: rank 0 undoes the load on the
other ranks and refuses it (tandem/engine/parallel/group.py), so no step names it. The rank
exits non-zero when rank 0 is gone (end of its stdin) or a collective fails (a peer died, or
the group's timeout passed), so no rank outlives its group.

A worker's follower module (RankGroup's ``follower_module``) calls ``main(make_agent)``: once
the runner is built, ``make_agent(kv_cache, rank, world, agent_in, agent_out)`` starts the
worker's agent for this rank over its own pipe pair (e.g. the rank's KV transfer endpoint,
moving this rank's KV heads); the step loop goes on beside it, and the agent is closed when
the loop ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

from tandem.engine.parallel.step_wire import StepInputs, StepWireError, read_frame, write_frame

log = logging.getLogger("tandem.engine.parallel.follower")


class RankAgent(Protocol):
    """What a worker runs beside a follower's step loop (see the module docstring)."""

    def close(self) -> None:
        """Stop, releasing whatever the agent holds (its connections, its threads)."""


# (this rank's KV cache tensor, rank, world, the agent's read pipe, its write pipe)
MakeAgent = Callable[[Any, int, int, BinaryIO, BinaryIO], RankAgent]


def serve(inp: BinaryIO, reply: BinaryIO, make_agent: MakeAgent | None = None,
          agent_pipes: tuple[BinaryIO, BinaryIO] | None = None) -> int:
    """Follow rank 0's frames until ``stop`` (0) or until it is gone (1)."""
    import torch

    from tandem.engine.checkpoint import load_checkpoint
    from tandem.engine.config import ModelConfig
    from tandem.engine.model_runner import ModelRunner
    from tandem.engine.models.weights import torch_dtype
    from tandem.engine.parallel.collectives import join, rank_device, rank_threads
    from tandem.engine.parallel.shard import local_arch
    from tandem.engine.runner_config import RunnerConfig

    init = _expect(inp, "init")
    rank, world = int(init["rank"]), int(init["world"])
    mc = ModelConfig(**init["model"])
    device = rank_device(mc.device, rank)
    torch.set_num_threads(rank_threads(mc.num_threads, world))
    join(str(init["store_dir"]), rank, world, mc.device)
    try:
        dtype = torch_dtype(mc.resolved_dtype())
        ckpt = load_checkpoint(mc, dtype, torch.device(device), progress=False,
                               native=bool(init["native"]), tp=(world, rank),
                               expert_parallel=bool(init.get("expert_parallel", False)))
        assert ckpt.shard is not None
        msg = _expect(inp, "runner", "memory")
        if msg["kind"] == "memory":  # rank 0 sizes the pool by every rank's room
            free, total = torch.cuda.mem_get_info(torch.device(device))
            write_frame(reply, {"kind": "memory", "free": int(free), "total": int(total)})
            msg = _expect(inp, "runner")
        rc = RunnerConfig(int(msg["num_blocks"]), int(msg["block_size"]), dtype,
                          torch.device(device), str(msg["backend"]), int(msg["max_model_len"]),
                          str(msg["kv_cache_dtype"]), native_kernels=bool(msg["native_kernels"]),
                          tensor_parallel=True)
        runner = ModelRunner(ckpt.model, local_arch(ckpt.arch, ckpt.shard), rc)
        if msg.get("lora") is not None:  # rank 0 sends every adapter it registers
            from tandem.engine.lora.config import LoraConfig
            from tandem.engine.lora.manager import LoraManager
            from tandem.engine.parallel.rank_slots import rank_lora_slots

            bound = msg["lora"].get("max_cpu_loras")
            lc = LoraConfig(enabled=True, max_lora_rank=int(msg["lora"]["max_lora_rank"]),
                            max_cpu_loras=rank_lora_slots(
                                rank, None if bound is None else int(bound)))
            runner.lora = LoraManager(lc, ckpt.model, ckpt.arch, dtype, torch.device(device),
                                      shard=ckpt.shard)
        agent = (make_agent(runner.kv_cache, rank, world, *agent_pipes)
                 if make_agent is not None and agent_pipes is not None else None)
    except Exception as exc:
        log.exception("rank %d failed to start", rank)
        write_frame(reply, {"kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    write_frame(reply, {"kind": "ready"})
    try:
        return _follow(inp, reply, runner, rank)
    finally:
        if agent is not None:
            agent.close()


def _follow(inp: BinaryIO, reply: BinaryIO, runner: Any, rank: int) -> int:
    from tandem.engine.parallel.collectives import leave

    while True:
        msg = read_frame(inp)
        if msg is None:
            log.error("rank %d: rank 0 is gone; exiting", rank)
            return 1
        kind = msg["kind"]
        if kind == "step":
            step = StepInputs.from_wire(msg)
            if step.loras is None:
                runner.run_inputs(step)
            else:
                with runner.lora.step(step.loras, runner.device):
                    runner.run_inputs(step)
        elif kind in ("lora_load", "lora_unload"):
            write_frame(reply, {"kind": "done", "of": kind, "error": _adapter(runner, msg, rank)})
        elif kind == "copy":
            runner.copy_blocks([(int(a), int(b)) for a, b in msg["pairs"]])
        elif kind == "stop":
            leave()
            return 0
        else:
            raise StepWireError(f"unexpected frame {kind!r}")


def _adapter(runner: Any, msg: dict[str, Any], rank: int) -> str | None:
    """Load or drop the adapter ``msg`` names; the reason this rank could not, or None."""
    name = str(msg["name"])
    try:
        if msg["kind"] == "lora_load":
            runner.lora.add(name, str(msg["path"]), bytes(msg["config"]), bytes(msg["weights"]))
        else:
            runner.lora.forget(name)
    except Exception as exc:  # LoraError, out of memory: this rank's refusal, not its end
        log.exception("rank %d could not %s LoRA adapter %r", rank,
                      "load" if msg["kind"] == "lora_load" else "drop", name)
        return f"{type(exc).__name__}: {exc}"
    return None


def _expect(inp: BinaryIO, *kinds: str) -> dict[str, Any]:
    msg = read_frame(inp)
    if msg is None:
        raise SystemExit(1)  # rank 0 went away before the group formed
    if msg["kind"] not in kinds:
        raise StepWireError(f"expected a {' or '.join(kinds)} frame, got {msg['kind']!r}")
    return msg


def main(make_agent: MakeAgent | None = None) -> int:
    """Entry point of a follower process (argv: the reply pipe's fd, then, with an agent, its
    read and write pipes' fds)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s tp-follower %(message)s")
    # Rank 0 decides when this rank ends (a stop frame, or its pipe closing): a Ctrl-C meant
    # for the terminal's process group, or a signal to every process, must not break the
    # group under a worker that drains.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reply = os.fdopen(int(sys.argv[1]), "wb", buffering=0)
    pipes = ((os.fdopen(int(sys.argv[2]), "rb", buffering=0),
              os.fdopen(int(sys.argv[3]), "wb", buffering=0)) if len(sys.argv) == 4 else None)
    try:
        return serve(sys.stdin.buffer, reply, make_agent, pipes)
    except Exception:  # a failed collective (a peer died, the timeout passed), a bad frame
        log.exception("tensor-parallel follower stopped")
        return 1


if __name__ == "__main__":
    sys.exit(main())
