"""Build our model from a local checkpoint directory (config.json + *.safetensors), strictly.

    config.json --model_type--> family (registry.py; refused before transformers is asked)
                --AutoConfig--> spec.check (every forward-changing field honoured or refused)
                --> ModelArch --plan--> every tensor to consume, copied layer by layer
    tensors left over (not consumed, not ignorable) --> UnusedTensorsError naming them
    (but a family's extra layers past the forward's, skipped with a log line: spec.ExtraLayers)
    experts held elsewhere (``experts``: one rank's range under expert parallelism) --> their
    slots dropped from the plan, their tensors never read

Tensors are streamed from safetensors and copied into our (fused) parameters layer by layer,
with a progress bar; nothing is materialized twice, and each copy checks its shape. The
linears of a pre-quantized checkpoint (tandem/engine/quant/prequantized) become Int4Linear /
Int8Linear built from the stored values; an FP8 checkpoint's become PackedLinear layers of
e4m3 bytes for the native CPU kernels (``native_layout``), else are dequantized into float
linears as they are copied (``PrequantizedFormat.float_weight``).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from tandem.engine.errors import ModelLoadError, UnsupportedConfigError, UnusedTensorsError
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers.moe_experts import AbsentExpert, Experts
from tandem.engine.models.layers.rotary import rotary_tables
from tandem.engine.models.linear import attach_fp32_shadows
from tandem.engine.models.registry import arch_of, checkpoint_family, family, read_config_json
from tandem.engine.models.spec import ExtraLayers
from tandem.engine.models.tensor_plan import Group, LinearSlot, WeightPlan
from tandem.engine.quant.apply import set_module
from tandem.engine.quant.kv_scales import read_kv_scales
from tandem.engine.quant.prequantized import (
    PrequantizedFormat,
    build_linear,
    concat_rows,
    detect_format,
)

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def torch_dtype(name: str) -> torch.dtype:
    """Map a dtype name from the config to a torch dtype."""
    return _DTYPES[name]


def load_hf_config(path: Path):  # -> transformers.PretrainedConfig
    """Read ``config.json`` with transformers (so RoPE parameters are normalized)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True)


def read_arch(path: Path) -> tuple[Any, ModelArch]:
    """The checkpoint's HF config and our architecture summary of it. An unknown model_type
    is refused from config.json alone (UnsupportedModelError), a config value the family does
    not compute by name (UnsupportedConfigError)."""
    checkpoint_family(path)
    hf_config = load_hf_config(path)
    return hf_config, arch_of(hf_config, read_config_json(path))


def load_model(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    progress: bool = True,
    config: tuple[Any, ModelArch] | None = None,
    fp32_shadows: bool = True,
    native_layout: bool = False,
    experts: range | None = None,
) -> tuple[CausalLM, ModelArch]:
    """Instantiate our model for the checkpoint at ``path`` and load its weights.

    Every tensor of the checkpoint is consumed, or the load fails (UnusedTensorsError).
    A pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors: tandem/engine/quant/prequantized)
    gets its quantized linears as Int4Linear / Int8Linear built from the stored values, with
    no float copy of them ever made; ``model.quant_format`` names the format ("none" if dense).
    ``config`` is ``read_arch(path)``'s result when the caller already has it.
    ``fp32_shadows``: give a CPU bf16 model's linears their fp32 copies for the torch path
    (tandem/engine/models/linear.py); off where the native fused forward will serve it.
    ``native_layout``: the native CPU kernels will serve this model, so a format with a
    layout of its own there keeps it (an FP8 checkpoint's e4m3 linears: PackedLinear) instead
    of being dequantized at load.
    ``experts``: the routed experts of every MoE layer this process holds (one rank's under
    expert parallelism: tandem/engine/parallel/plan.py); the others' tensors are never read
    (counted as consumed) and :class:`AbsentExpert` stands in their place."""
    hf_config, arch = config or read_arch(path)
    spec = family(arch.model_type)
    plan = spec.plan(arch)
    fmt = detect_format(path)
    if native_layout:
        fmt = fmt.for_native_kernels()
    tensors = _open_tensors(path)
    cos, sin = rotary_tables(hf_config, max_positions)
    with torch.device("meta"):
        model = spec.model_class()(arch, cos, sin)
    if experts is not None:
        plan = _hold_experts(model, plan, tensors, experts)
    linears = plan.linears()
    stored = [lin.module for lin in linears if _stored_quantized(fmt, lin.parts, tensors)]
    dequantized = {n: why for n in stored if (why := fmt.dequantizes(n)) is not None}
    quantized = {n for n in stored if n not in dequantized}
    absorbed = sorted(n for n in quantized if n.endswith(".kv_b_proj"))
    if absorbed:  # MLA's decode folds its rows into the queries (layers/mla.py)
        raise ModelLoadError(f"{absorbed[0]} is stored quantized ({fmt.label}): multi-head "
                             "latent attention reads kv_b_proj as float weights")
    shapes = {}  # what each quantized layer must be: the checkpoint's is checked against it
    for name in quantized:  # a storage-less placeholder until the layer is built below
        meta = model.get_submodule(name)
        shapes[name] = (meta.out_features, meta.in_features)
        set_module(model, name, nn.Identity())
    model = model.to_empty(device=device).to(dtype)
    model.cos_table = cos.to(device)
    model.sin_table = sin.to(device)
    if arch.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load = _LinearLoader(model, tensors, fmt, shapes, dtype, device)
    groups = tqdm([plan.top, *plan.layers], desc="Loading weights", unit="layer",
                  disable=not progress)
    with torch.no_grad():
        for group in groups:
            _load_group(model, group, tensors, load)
        if arch.tie_word_embeddings and "lm_head.weight" in tensors:
            _check_tied_head(model, tensors)
        model.kv_scales = read_kv_scales(tensors.names(), tensors.get, arch.num_layers)
    _check_all_used(tensors, spec.ignored_tensors, spec.extra_layers(hf_config))
    model.eval()
    if fmt.dequantizes_at_load and not quantized:
        model.dequantized_from = fmt.label
        log.info("%s checkpoint: weights dequantized at load", fmt.label)
    if quantized:
        model.quant_format = fmt.label
        log.info("pre-quantized checkpoint %s: %d of %d linear layers quantized (%d decoder "
                 "layers, lm_head %s)", fmt.label, len(quantized), len(linears),
                 arch.num_layers, "quantized" if "lm_head" in quantized else "not quantized")
    if fmt.dequantizes_at_load and stored:  # what a format that can dequantize kept
        log.info("%s checkpoint: kept quantized: %s; dequantized at load: %s", fmt.label,
                 linear_names(quantized) or "none", "; ".join(
                     f"{linear_names(n for n, w in dequantized.items() if w == why)} ({why})"
                     for why in sorted(set(dequantized.values()))) or "none")
    if fp32_shadows and device.type == "cpu" and dtype == torch.bfloat16:
        attach_fp32_shadows(model)
    return model, arch


def linear_names(names: Iterable[str]) -> str:
    """Module names for a log line, each decoder layer's alike counted once:
    ``layers.*.mlp.down_proj x24, lm_head``."""
    counts = Counter(re.sub(r"^layers\.\d+\.", "layers.*.", n) for n in names)
    return ", ".join(name if c == 1 else f"{name} x{c}" for name, c in sorted(counts.items()))


class _Tensors:
    """Name -> tensor lookup across the shards of a safetensors checkpoint (files kept open),
    remembering which names were read."""

    def __init__(self, files: list[Path]) -> None:
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, Any] = {}
        for h in self._handles:
            for k in h.keys():
                self._where[k] = h
        self._used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
        self._used.add(name)
        return self._where[name].get_tensor(name)

    def skip(self, modules: set[str]) -> None:
        """Count every tensor under ``modules`` (dotted module names) as consumed without
        reading it (weights another process holds): one set lookup per dotted prefix of each
        name, so a model of many experts skips in time linear in its tensors."""
        if modules:
            self._used.update(n for n in self._where if any(
                n[:i] in modules for i, c in enumerate(n) if c == "."))

    def names(self) -> list[str]:
        """Every tensor name of the checkpoint."""
        return list(self._where)

    def unused(self, ignorable: tuple[str, ...]) -> list[str]:
        """Every tensor never read (``ignorable`` suffixes aside), sorted."""
        return sorted(n for n in self._where
                      if n not in self._used and not n.endswith(ignorable))


def _hold_experts(model: nn.Module, plan: WeightPlan, t: _Tensors, held: range) -> WeightPlan:
    """Keep experts ``held`` of every MoE layer of ``model`` (still on the meta device);
    ``plan`` without the other experts' linears, whose checkpoint tensors count as consumed
    unread."""
    for m in model.modules():
        if isinstance(m, Experts):
            m.keep(held)
    absent = [lin for lin in plan.linears()
              if isinstance(model.get_submodule(lin.module.rpartition(".")[0]), AbsentExpert)]
    t.skip({part for lin in absent for part in lin.parts})
    return plan.without({lin.module for lin in absent})


def _check_all_used(t: _Tensors, ignorable: tuple[str, ...], extra: ExtraLayers | None) -> None:
    """UnusedTensorsError naming every tensor never read, but those of ``extra``'s layers
    (skipped with a log line) and the ``ignorable`` suffixes."""
    left = t.unused(ignorable)
    if extra is not None:
        skipped = [n for n in left if extra.holds(n)]
        if skipped:
            layers = sorted({int(n.split(".")[2]) for n in skipped})
            log.info("skipped %d checkpoint tensors of layers %s: %s", len(skipped),
                     ", ".join(map(str, layers)), extra.why)
            left = [n for n in left if not extra.holds(n)]
    if left:
        raise UnusedTensorsError(left)


def _open_tensors(path: Path) -> _Tensors:
    files = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"].values())
        files = [path / n for n in sorted(names)]
    if not files:
        raise ModelLoadError(f"no safetensors weights in {path}")
    return _Tensors(files)


def _stored_quantized(fmt: PrequantizedFormat, parts: tuple[str, ...], t: _Tensors) -> bool:
    flags = {fmt.is_quantized(part, t) for part in parts}
    if len(flags) > 1:
        raise ModelLoadError(f"{', '.join(parts)} are fused but only some are quantized")
    return flags.pop()


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    """``dst.copy_(src)`` for equal shapes only (copy_ would broadcast a wrong one), never from
    fp8 storage (its scales live beside it: only an fp8 checkpoint's linears read them)."""
    if src.dtype in _FP8:
        raise ModelLoadError(f"{name} is stored as {src.dtype} where no scale applies")
    if tuple(dst.shape) != tuple(src.shape):
        raise ModelLoadError(f"{name}: checkpoint shape {tuple(src.shape)}, the config says "
                             f"{tuple(dst.shape)}")
    dst.copy_(src)


class _LinearLoader:
    """Fills one linear layer of the model: float weights copied in place, quantized ones
    built from the checkpoint's values (replacing the placeholder)."""

    def __init__(self, model: nn.Module, t: _Tensors, fmt: PrequantizedFormat,
                 quantized: dict[str, tuple[int, int]], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.model, self.t, self.fmt, self.quantized = model, t, fmt, quantized
        self.dtype, self.device = dtype, device

    def __call__(self, linear: LinearSlot) -> None:
        name, parts, t = linear.module, linear.parts, self.t
        bias = torch.cat([t.get(p + ".bias") for p in parts]) if linear.bias else None
        if name in self.quantized:
            weight = concat_rows([self.fmt.unpack(part, t) for part in parts])
            b = None if bias is None else bias.to(self.dtype)
            layer = build_linear(weight, b, self.device)
            # The kernels write out_features values a row and read in_features: a checkpoint
            # whose stored shape is not the model's must fail here, not overrun a buffer.
            want, got = self.quantized[name], (layer.out_features, layer.in_features)
            if got != want or (b is not None and tuple(b.shape) != (want[0],)):
                raise ModelLoadError(
                    f"{name}: the checkpoint's {self.fmt.label} weights are {got[0]} x {got[1]}"
                    f"{'' if b is None else f' (bias {tuple(b.shape)})'}, the model's "
                    f"{want[0]} x {want[1]}")
            set_module(self.model, name, layer)
            return
        lin = self.model.get_submodule(name)
        weight = torch.cat([self.fmt.float_weight(p, t) for p in parts], dim=0)
        _copy(lin.weight, weight, name)
        if bias is not None:
            _copy(lin.bias, bias, name + " bias")


def _load_group(model: nn.Module, group: Group, t: _Tensors, load: _LinearLoader) -> None:
    for linear in group.linears:
        load(linear)
    for slot in group.tensors:
        _copy(model.get_parameter(slot.param), t.get(slot.name), slot.name)


def _check_tied_head(model: nn.Module, t: _Tensors) -> None:
    """A tied checkpoint that stores lm_head.weight anyway: consumed if it is the embedding
    (transformers ties it and never reads it), refused if it differs."""
    head, embed = t.get("lm_head.weight"), model.embed_tokens.weight
    if not torch.equal(head.to(embed.device, embed.dtype), embed):
        raise UnsupportedConfigError(
            model.arch.model_type, "tie_word_embeddings", True,
            "the checkpoint's lm_head.weight differs from model.embed_tokens.weight")
