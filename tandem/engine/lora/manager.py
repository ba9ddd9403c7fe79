"""The adapters one engine serves, and the hooks that add their deltas to the base model.

    register(name, path) -> LoraAdapter   (checked against the base model; --max-cpu-loras)
    unregister(name)                      (refused while a request runs under it)
    slots(row_adapters) -> (adapters, row_slots)   the step's adapters, one slot each
    step(row_adapters): with ...:         the model's forward adds each row's adapter delta

Each adapted projection (q/k/v fused, o, gate/up fused, down: tandem/engine/lora/adapter.py)
gets a forward hook that adds the step's batched delta (tandem/engine/lora/batch.py) to the
base output: the base layer runs as it is, whatever holds its weights (float, int8/int4, GGUF
blocks in PackedLinear), so adapters ride on quantized bases. The hooks only act inside
``step``: the torch forward's path, and the reference of the fused native CPU forward, which
never calls these modules and adds the deltas itself from the same ``slots``
(tandem/engine/native/lora_step.py).

On CUDA with Triton importable the delta is Triton's instead (``use_triton``): per projection
one segmented shrink and one expand launch over the rows grouped by adapter slot
(tandem/engine/lora/triton_lora.py), the torch gather-matmul staying the reference.

In a tensor-parallel group (``shard``) every rank's manager holds its cut of each adapter
(tandem/engine/parallel/lora_cut.py) and hooks a row-parallel layer inside its all-reduce, so
the delta joins the rank's partial sum. Rank 0 reads an adapter's files once and hands their
bytes to the other ranks (``mirror``: the RankGroup), and serves the adapter only once every
rank answered that it holds its cut, so every rank holds the same adapters, loaded at start
or at runtime. A rank that cannot (its adapter slots, its memory) fails the load with its
reason and no rank keeps the adapter; an unload reaches every rank the same way.

A block's prefix-cache hash is salted by the adapter's identity (``salt``): KV computed under
one adapter is never found by a request under another, or under the base model.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from tandem.common.block_hash import adapter_salt
from tandem.engine.errors import InvalidRequestError
from tandem.engine.lora.adapter import (
    GROUPS,
    LoraAdapter,
    LoraError,
    module_dims,
    parse_adapter,
    read_adapter_files,
)
from tandem.engine.lora.batch import LoraBatch, Stacks, stack
from tandem.engine.lora.config import LoraConfig, check_name
from tandem.engine.models.arch import ModelArch
from tandem.engine.parallel.collectives import AllReduce
from tandem.engine.parallel.lora_cut import cut_adapter
from tandem.engine.parallel.plan import RankShard
from tandem.engine.parallel.shard import local_arch
from tandem.engine.parallel.step_wire import MAX_FRAME

if TYPE_CHECKING:  # triton_lora imports triton: loaded only when a CUDA step uses it
    from tandem.engine.lora.triton_lora import TritonLoraBatch

_KEPT_STACKS = 4  # sets of adapters whose stacked weights are kept
# An adapter's files in a group's step frame (lora_load), with room for the frame's own fields
MIRROR_BYTES = MAX_FRAME - (1 << 20)


class AdapterMirror(Protocol):
    """The other ranks of a tensor-parallel group, as rank 0's manager keeps them in step."""

    def load_adapter(self, name: str, path: str, config: bytes, weights: bytes) -> None:
        """Have every other rank hold adapter ``name`` (its files' bytes, checked here); once
        this returns, each does. Raises LoraError naming a rank that could not, after the
        others dropped it again."""

    def unload_adapter(self, name: str) -> None:
        """Have every other rank forget adapter ``name``; once this returns, each has.
        Raises LoraError naming a rank that reported an error."""


def triton_usable(device: torch.device) -> bool:
    """Whether a step's deltas on ``device`` run the Triton kernels: CUDA, Triton installed."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


class LoraManager:
    """The registered adapters of one engine and the forward hooks on its model."""

    def __init__(self, config: LoraConfig, model: nn.Module, arch: ModelArch,
                 dtype: torch.dtype, device: torch.device, shard: RankShard | None = None,
                 mirror: AdapterMirror | None = None) -> None:
        """``arch``: the whole model's; ``shard``: this rank's slice in a tensor-parallel
        group (None: one process); ``mirror``: on rank 0, the group's other ranks."""
        if arch.moe is not None or arch.mla is not None:
            raise LoraError("LoRA adapters are served on dense attention models only (this "
                            "model has mixture-of-experts or latent-attention layers)")
        self.config = config
        self.arch = arch
        self._dtype, self._device = dtype, device
        self._shard, self._mirror = shard, mirror
        local = arch if shard is None else local_arch(arch, shard)  # what the hooks see
        self.adapters: dict[str, LoraAdapter] = {}
        # the delta's kernels: Triton's on CUDA where importable, else the torch reference
        # (a test sets it False to compare the two on one device)
        self.use_triton = triton_usable(device)
        self._batch: LoraBatch | TritonLoraBatch | None = None
        # stacked weights of the recent sets of adapters a step carried (lora/batch.py, or
        # padded per slot for the Triton kernels), keyed by kernel kind and adapter names
        self._stacks: OrderedDict[tuple[bool, tuple[str, ...]], Stacks] = OrderedDict()
        h, q, kv = local.hidden_size, local.num_heads * local.head_dim, \
            local.num_kv_heads * local.head_dim
        self._dims = {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h),
                      "gate_up_proj": (h, 2 * local.intermediate_size),
                      "down_proj": (local.intermediate_size, h)}
        subs = module_dims(local)
        self._shapes = {group: (subs[names[0]][0], tuple(subs[n][1] for n in names))
                        for group, names in GROUPS.items()}
        self._bounds: dict[str, tuple[torch.Tensor, int]] | None = None  # Triton: made once
        self._hooks = [self._hook(i, layer, group)
                       for i, layer in enumerate(model.layers)  # type: ignore[attr-defined]
                       for group in GROUPS]
        for name, path in config.modules:
            self.register(name, path)

    def _hook(self, index: int, layer: nn.Module, group: str) -> Any:
        parent = layer.self_attn if group in ("qkv_proj", "o_proj") else layer.mlp
        module: nn.Module = getattr(parent, group)
        if isinstance(module, AllReduce):  # row-parallel: the delta joins the partial sum
            module = module.inner

        def add_delta(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor
                      ) -> torch.Tensor | None:
            batch = self._batch
            if batch is None:
                return None
            batch.add_delta(out, args[0], index, group)
            return out

        return module.register_forward_hook(add_delta)

    def register(self, name: str, path: str) -> LoraAdapter:
        """Load and check the adapter at ``path`` under ``name``. Raises LoraError."""
        try:
            check_name(name)
        except ValueError as err:
            raise LoraError(str(err)) from err
        if name in self.adapters:
            raise LoraError(f"LoRA adapter {name!r} is already loaded")
        bound = self.config.max_cpu_loras
        if bound is not None and len(self.adapters) >= bound:
            raise LoraError(f"{len(self.adapters)} LoRA adapters are loaded, --max-cpu-loras "
                            f"is {bound}: unload one first")
        config_bytes, weights_bytes = read_adapter_files(name, path)
        if self._mirror is not None and len(config_bytes) + len(weights_bytes) > MIRROR_BYTES:
            # the followers get the files' bytes in one step frame (step_wire.MAX_FRAME)
            raise LoraError(f"LoRA adapter {name!r} is {len(weights_bytes)} bytes: a "
                            f"tensor-parallel group takes adapters up to {MIRROR_BYTES} bytes")
        adapter = self._parse(name, str(path), config_bytes, weights_bytes)
        if self._mirror is not None:
            # held by every other rank before any request can name it here; LoraError (the
            # rank that could not, and why) when one could not: then no rank holds it
            self._mirror.load_adapter(name, str(path), config_bytes, weights_bytes)
        self._hold(name, adapter)
        return adapter

    def add(self, name: str, path: str, config: bytes, weights: bytes) -> LoraAdapter:
        """Hold the adapter whose files' bytes are ``config`` and ``weights`` (this rank's
        cut of it): what a tensor-parallel follower does with the bytes rank 0 sent. Raises
        LoraError, also when this rank already holds ``max_cpu_loras`` other adapters."""
        bound = self.config.max_cpu_loras
        if bound is not None and name not in self.adapters and len(self.adapters) >= bound:
            raise LoraError(f"this rank holds {len(self.adapters)} LoRA adapters, its limit "
                            f"is {bound}")
        adapter = self._parse(name, path, config, weights)
        self._hold(name, adapter)
        return adapter

    def _parse(self, name: str, path: str, config: bytes, weights: bytes) -> LoraAdapter:
        """The adapter these bytes hold, checked against the base model, cut to this rank."""
        adapter = parse_adapter(name, path, config, weights, self.arch,
                                self.config.max_lora_rank, self._dtype, self._device)
        return adapter if self._shard is None else cut_adapter(adapter, self._shard)

    def _hold(self, name: str, adapter: LoraAdapter) -> None:
        self.adapters[name] = adapter
        self._stacks.clear()

    def forget(self, name: str) -> None:
        """Drop adapter ``name`` here only (a follower told by rank 0; no check)."""
        self.adapters.pop(name, None)
        self._stacks.clear()

    def unregister(self, name: str, in_use: Callable[[str], bool]) -> None:
        """Forget adapter ``name``; refused (LoraError) while ``in_use(name)``, KeyError when
        it is not loaded. In a group every rank forgets it before this returns (rank 0 even
        when a follower reported an error dropping it, raised after: no step names it)."""
        if name not in self.adapters:
            raise KeyError(name)
        if in_use(name):
            raise LoraError(f"LoRA adapter {name!r} has requests in flight")
        try:
            if self._mirror is not None:
                self._mirror.unload_adapter(name)
        finally:
            self.forget(name)

    def get(self, name: str) -> LoraAdapter:
        """The adapter a request names. Raises InvalidRequestError (unknown adapter)."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise InvalidRequestError("lora", f"unknown LoRA adapter {name!r}")
        return adapter

    def salt(self, name: str) -> int | None:
        """The prefix-cache salt of a request under ``name`` ("" : the base model, None)."""
        return adapter_salt(self.get(name).identity) if name else None

    def identities(self) -> dict[str, str]:
        """name -> identity of every loaded adapter (what a worker reports)."""
        return {name: a.identity for name, a in self.adapters.items()}

    def slots(self, row_adapters: Sequence[str]) -> tuple[list[LoraAdapter], list[int]]:
        """The step's distinct adapters in order of first appearance (slot ``i``:
        ``adapters[i]``) and each row's slot (-1: the base model, ``""``)."""
        names = list(dict.fromkeys(n for n in row_adapters if n))
        slot = {n: i for i, n in enumerate(names)}
        return [self.adapters[n] for n in names], [slot.get(n, -1) for n in row_adapters]

    def _stacked(self, adapters: Sequence[LoraAdapter], make: Callable[[], Stacks]) -> Stacks:
        """The stacked weights of ``adapters`` for the current kernels, made on a miss."""
        key = (self.use_triton, tuple(a.name for a in adapters))
        stacks = self._stacks.get(key)
        if stacks is None:
            stacks = self._stacks[key] = make()
            while len(self._stacks) > _KEPT_STACKS:
                self._stacks.popitem(last=False)
        self._stacks.move_to_end(key)
        return stacks

    @contextmanager
    def step(self, row_adapters: Sequence[str], device: torch.device) -> Iterator[None]:
        """Within the block the model's forward adds the adapters' deltas, row ``i`` under
        ``row_adapters[i]`` ("": the base model)."""
        adapters, row_slots = self.slots(row_adapters)
        if self.use_triton:
            from tandem.engine.lora import triton_lora

            padded = self._stacked(adapters, lambda: triton_lora.stack_padded(
                adapters, self.arch.num_layers, self._shapes))
            if self._bounds is None:
                self._bounds = triton_lora.column_bounds(self._shapes, device)
            self._batch = triton_lora.TritonLoraBatch.build(row_slots, len(adapters), padded,
                                                            self._bounds, device)
        else:
            stacks = self._stacked(adapters, lambda: stack(adapters, self.arch.num_layers,
                                                           self._dims))
            self._batch = LoraBatch.build(adapters, row_slots, stacks, self._dtype, device)
        try:
            yield
        finally:
            self._batch = None
