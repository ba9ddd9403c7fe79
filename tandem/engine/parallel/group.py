"""Rank 0's side of a tensor-parallel group: start the other ranks, feed them every step,
take the whole worker down when one of them dies.

    RankGroup.launch ──spawn ranks 1..N-1 (python -m tandem.engine.parallel.follower)──>
        init frame (rank, world, rendezvous dir, model, expert parallel or not) ──> every
        rank joins the process group
    RankGroup.memory() (sizing the KV pool from device memory) ──> each follower answers its
        device's free and total bytes once its shard is loaded
    RankGroup.start(runner config) ──> each follower loads its shard, builds its runner,
        answers "ready" on its reply pipe (bounded wait; a follower that exits fails it)
    ModelRunner.execute ──RankGroup.step(inputs)──> every follower runs the same forward;
        the forwards meet in the row-parallel all-reduces
    RankGroup.load_adapter / unload_adapter ──lora_load | lora_unload──> every follower answers
        done (with its error, if any) on its reply pipe before the call returns
    RankGroup.close ──stop frame──> followers leave the group and exit 0

A caller may name the module the followers run (``follower_module``: a worker's, which serves
``follower.serve`` with an agent of its own beside it, e.g. each rank's KV transfer endpoint);
each follower then also has an agent pipe pair, which ``agents`` hands out: frames between
rank 0's caller and the follower's agent, never in the way of the step frames.

Rank 0 keeps the worker's gRPC, its scheduler and KV cache manager: one scheduler decides for
all ranks, and each rank's paged cache holds its own KV heads at the same block ids.

A LoRA adapter is held by every rank or by none: a follower that cannot hold one rank 0
accepted (over its adapter slots, short of memory, an error cutting it) answers with its
reason, the followers that loaded it drop it again, and the load fails with LoraError naming
the rank; the group serves on with the adapters it had.

A follower that exits while the group serves cannot be replaced inside a live group (its
shard and its KV blocks are gone): a watcher thread logs which rank died and ends this
process with ``EXIT_RANK_DIED``, whose pipes closing makes the remaining followers exit too.
A forward that fails on rank 0 (an all-reduce whose peer died, or hung past the collective
timeout) ends it the same way (``abort``): the others wait in a collective it never joins.
The launcher or Ray restarts the worker as a unit; the router migrates its requests as for
any worker that died.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

from tandem.engine.config import EngineConfig, ModelConfig
from tandem.engine.errors import ModelLoadError
from tandem.engine.parallel.step_wire import StepInputs, StepWireError, read_frame, write_frame

if TYPE_CHECKING:
    from tandem.engine.runner_config import RunnerConfig

log = logging.getLogger(__name__)

EXIT_RANK_DIED = 3  # this worker's status when a rank of its group died under it
READY_TIMEOUT_S = 900.0  # loading a shard may take this long before start-up fails
# a follower parses and cuts an adapter (up to a step frame's size) within this; one that does
# not answer by then is stuck, and the group with it
ADAPTER_ANSWER_TIMEOUT_S = 600.0


class RankGroupError(ModelLoadError):
    """The group could not start (a follower failed or did not answer in time)."""


@dataclasses.dataclass(slots=True)
class _Follower:
    rank: int
    proc: subprocess.Popen[bytes]
    reply: Any  # the read end of its reply pipe (a binary file)
    agent: tuple[Any, Any] | None = None  # (write to its agent, read from it), binary files


class RankGroup:
    """Ranks 1..N-1 of a tensor-parallel group, as rank 0 drives them."""

    def __init__(self, world: int, store_dir: str, followers: list[_Follower]) -> None:
        self.world = world
        self._store_dir = store_dir
        self._followers = followers
        self._closing = False
        self._serving = False  # before start() returns, start-up reports a follower's exit
        self._lock = threading.Lock()  # one frame at a time on every pipe
        self._asking = threading.Lock()  # one adapter change at a time, answers read in turn
        for f in followers:
            threading.Thread(target=self._watch, args=(f,), name=f"tp-rank-{f.rank}",
                             daemon=True).start()
        # an engine nobody closed (offline use) still stops its ranks cleanly at exit
        atexit.register(self.close)

    @classmethod
    def launch_for(cls, config: EngineConfig, native: bool,
                   follower_module: str | None = None) -> RankGroup:
        """The group ``config.tensor_parallel_size`` asks for, after checking that the model
        splits over it (TensorParallelError, naming the numbers, before any rank starts).
        The checkpoint is resolved here, once (a GGUF converted once, not by every rank)."""
        from tandem.engine.checkpoint import tp_group
        from tandem.engine.loader import resolve_model
        from tandem.engine.models.weights import read_arch
        from tandem.engine.parallel.shard import rank_shard
        from tandem.engine.quant.gguf_blocks import gguf_source

        mc, world = config.model, config.tensor_parallel_size
        ep = config.enable_expert_parallel
        path = resolve_model(mc.model, mc.cache_dir)
        _, arch = read_arch(path)
        rank_shard(arch, world, 0, tp_group(mc, gguf_source(mc.model), path), ep)
        return cls.launch(world, mc, native, follower_module, ep)

    @classmethod
    def launch(cls, world: int, model: ModelConfig, native: bool,
               follower_module: str | None = None,
               expert_parallel: bool = False) -> RankGroup:
        """Spawn ranks 1..world-1 for ``model`` and form the process group with them (this
        process is rank 0). ``native``: whether rank 0 builds the native kernels' layout, so
        every rank quantizes alike. ``follower_module``: what the followers run (module
        docstring). ``expert_parallel``: each rank holds whole routed experts
        (tandem/engine/parallel/plan.py)."""
        from tandem.engine.parallel.collectives import join

        store_dir = tempfile.mkdtemp(prefix="tandem-tp-")  # mode 0700: this user only
        followers: list[_Follower] = []
        try:
            for rank in range(1, world):
                followers.append(_spawn(rank, world, store_dir, model, native,
                                        follower_module, expert_parallel))
            group = cls(world, store_dir, followers)
        except BaseException:
            _kill(followers)
            shutil.rmtree(store_dir, ignore_errors=True)
            raise
        try:
            join(store_dir, 0, world, model.device)
        except BaseException:
            group.close()
            raise
        return group

    def start(self, runner: dict[str, Any]) -> None:
        """Hand every follower the runner's settings (``num_blocks`` decided by rank 0) and
        wait until each has built its shard and its KV cache."""
        self._send({"kind": "runner", **runner})
        deadline = time.monotonic() + READY_TIMEOUT_S
        for f in self._followers:
            _await(f, "ready", deadline)
        self._serving = True
        for f in self._followers:  # one that died while the others got ready
            if f.proc.poll() is not None:
                raise RankGroupError(f"tensor-parallel rank {f.rank} exited during start-up")
        log.info("tensor-parallel group of %d ranks ready", self.world)

    def memory(self) -> list[tuple[int, int]]:
        """Each follower's device's (free, total) bytes once it has loaded its shard, ranks
        1..N-1 in order: rank 0 sizes the group's one KV pool by the rank with the least room
        (tandem/engine/kv_budget.py). Asked before ``start``; raises RankGroupError as it."""
        self._send({"kind": "memory"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        answers = [_await(f, "memory", deadline) for f in self._followers]
        return [(int(m["free"]), int(m["total"])) for m in answers]

    def agents(self) -> list[tuple[Any, Any]]:
        """Each follower's agent pipes, by rank 1..N-1: (write end, read end) as binary files
        (empty unless the group was launched with a ``follower_module``)."""
        return [f.agent for f in self._followers if f.agent is not None]

    def step(self, inputs: StepInputs) -> None:
        """Have every follower run this forward (rank 0 runs it right after)."""
        self._send(inputs.to_wire())

    def load_adapter(self, name: str, path: str, config: bytes, weights: bytes) -> None:
        """Have every follower hold LoRA adapter ``name``, from the bytes of its files rank 0
        read and checked (the same bytes everywhere: no rank re-reads a file that may have
        changed). Sent before any step that names it, on the same pipe; returns once every
        follower holds it. Raises LoraError naming the first rank that could not, and why,
        after the followers that loaded it dropped it again."""
        from tandem.engine.lora.adapter import LoraError

        with self._asking:
            refused = self._ask(self._followers, {"kind": "lora_load", "name": name,
                                                  "path": path, "config": config,
                                                  "weights": weights})
            if not refused:
                return
            loaded = [f for f in self._followers if f.rank not in refused]
            for rank, why in self._ask(loaded, {"kind": "lora_unload", "name": name}).items():
                log.error("tensor-parallel rank %d could not drop LoRA adapter %r: %s",
                          rank, name, why)
        rank, why = min(refused.items())
        others = f" (and rank(s) {sorted(refused)[1:]})" if len(refused) > 1 else ""
        raise LoraError(f"tensor-parallel rank {rank}{others} could not load LoRA adapter "
                        f"{name!r}: {why}; no rank holds it, the worker serves on without it")

    def unload_adapter(self, name: str) -> None:
        """Have every follower forget LoRA adapter ``name``; returns once each has. Raises
        LoraError naming a rank that reported an error."""
        from tandem.engine.lora.adapter import LoraError

        with self._asking:
            refused = self._ask(self._followers, {"kind": "lora_unload", "name": name})
        if refused:
            rank, why = min(refused.items())
            raise LoraError(f"tensor-parallel rank {rank} could not drop LoRA adapter "
                            f"{name!r}: {why}")

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Have every follower copy these KV blocks (copy-on-write of forked sequences)."""
        self._send({"kind": "copy", "pairs": [list(p) for p in pairs]})

    def close(self) -> None:
        """Stop the followers (each leaves the group and exits), bounded; then the group."""
        from tandem.engine.parallel.collectives import leave

        if self._closing:
            return
        self._closing = True
        atexit.unregister(self.close)
        try:
            self._send({"kind": "stop"})
        except (OSError, StepWireError):
            pass  # a follower already gone: it is killed below
        deadline = time.monotonic() + 30.0
        for f in self._followers:
            try:
                f.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank %d did not stop: killing it", f.rank)
                f.proc.kill()
                f.proc.wait()
            f.reply.close()
            if f.agent is not None:
                for end in f.agent:
                    end.close()
        leave()
        shutil.rmtree(self._store_dir, ignore_errors=True)

    def abort(self, why: BaseException) -> NoReturn:
        """End this process: the group is out of step (a collective failed: a peer died, or
        hung past the timeout; or a forward failed on this rank while the others wait in
        one), and no rank can compute alone. Its pipes closing ends the followers."""
        log.critical("tensor-parallel group of %d ranks broken (%s: %s); this worker exits",
                     self.world, type(why).__name__, why)
        logging.shutdown()
        os._exit(EXIT_RANK_DIED)

    def _send(self, msg: dict[str, Any], followers: list[_Follower] | None = None) -> None:
        with self._lock:
            try:
                for f in self._followers if followers is None else followers:
                    assert f.proc.stdin is not None
                    write_frame(f.proc.stdin, msg)
            except OSError as exc:  # a follower's pipe closed: it is gone
                if self._closing:
                    raise
                self.abort(exc)

    def _ask(self, followers: list[_Follower], msg: dict[str, Any]) -> dict[int, str]:
        """Send ``msg`` to ``followers`` and read each one's answer: rank -> its error, for
        those that reported one. A follower that does not answer in time, or answers out of
        turn, has left the group's step: the worker ends (``abort``)."""
        self._send(msg, followers)
        deadline = time.monotonic() + ADAPTER_ANSWER_TIMEOUT_S
        refused: dict[int, str] = {}
        for f in followers:
            error = self._answer(f, str(msg["kind"]), deadline)
            if error is not None:
                refused[f.rank] = error
        return refused

    def _answer(self, f: _Follower, kind: str, deadline: float) -> str | None:
        ready, _, _ = select.select([f.reply], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            self.abort(TimeoutError(f"rank {f.rank} did not answer {kind} within "
                                    f"{ADAPTER_ANSWER_TIMEOUT_S:.0f}s"))
        try:
            msg = read_frame(f.reply)
        except StepWireError as exc:
            self.abort(exc)
        if msg is None:
            self.abort(EOFError(f"rank {f.rank} exited (status {f.proc.wait()})"))
        if msg.get("kind") != "done" or msg.get("of") != kind:
            self.abort(StepWireError(f"rank {f.rank} answered {msg.get('kind')!r} "
                                     f"({msg.get('of')!r}) to {kind}"))
        error = msg.get("error")
        return None if error is None else str(error)

    def _watch(self, f: _Follower) -> None:
        status = f.proc.wait()
        if self._closing or not self._serving:
            return
        log.critical("tensor-parallel rank %d exited (status %s): the group cannot compute "
                     "without it; this worker exits", f.rank, status)
        logging.shutdown()
        os._exit(EXIT_RANK_DIED)


def runner_settings(rc: RunnerConfig) -> dict[str, Any]:
    """What a follower builds its runner from: rank 0's runner config, plain values."""
    return {"num_blocks": rc.num_blocks, "block_size": rc.block_size, "backend": rc.backend,
            "max_model_len": rc.max_model_len, "kv_cache_dtype": rc.kv_cache_dtype,
            "native_kernels": rc.native_kernels}


def _spawn(rank: int, world: int, store_dir: str, model: ModelConfig,
           native: bool, module: str | None = None,
           expert_parallel: bool = False) -> _Follower:
    read_end, write_end = os.pipe()
    # an agent's pipes: (its stdin-like read end, our write end), (our read end, its write end)
    agent_fds = (*os.pipe(), *os.pipe()) if module is not None else ()
    theirs = (write_end, agent_fds[0], agent_fds[3]) if agent_fds else (write_end,)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module or "tandem.engine.parallel.follower",
             *map(str, theirs)],
            stdin=subprocess.PIPE, pass_fds=theirs,
        )
    except BaseException:
        os.close(read_end)
        for fd in agent_fds[1:3]:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    assert proc.stdin is not None
    write_frame(proc.stdin, {"kind": "init", "rank": rank, "world": world,
                             "store_dir": store_dir, "native": native,
                             "expert_parallel": expert_parallel,
                             "model": dataclasses.asdict(model)})
    agent = ((os.fdopen(agent_fds[1], "wb", buffering=0),
              os.fdopen(agent_fds[2], "rb", buffering=0)) if agent_fds else None)
    return _Follower(rank, proc, os.fdopen(read_end, "rb", buffering=0), agent)


def _await(f: _Follower, kind: str, deadline: float) -> dict[str, Any]:
    """The follower's next start-up answer, which must be ``kind`` (RankGroupError if it
    failed, exited, said something else or did not answer by ``deadline``)."""
    left = deadline - time.monotonic()
    ready, _, _ = select.select([f.reply], [], [], max(0.0, left))
    if not ready:
        raise RankGroupError(f"tensor-parallel rank {f.rank} did not answer ({kind}) within "
                             f"{READY_TIMEOUT_S:.0f}s")
    msg = read_frame(f.reply)
    if msg is None:
        raise RankGroupError(f"tensor-parallel rank {f.rank} exited during start-up "
                             f"(status {f.proc.wait()})")
    if msg["kind"] != kind:
        raise RankGroupError(f"tensor-parallel rank {f.rank} failed to start: "
                             f"{msg.get('error', msg['kind'])}")
    return msg


def _kill(followers: list[_Follower]) -> None:
    for f in followers:
        f.proc.kill()
        f.proc.wait()
