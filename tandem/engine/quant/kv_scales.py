"""Calibrated fp8 KV scales a checkpoint carries (vLLM's ``k_scale``/``v_scale``), read strictly.

    model.layers.N.self_attn.k_scale / v_scale                (vLLM, compressed-tensors)
    model.layers.N.self_attn.k_proj.output_scale / v_proj...  (AutoFP8's older spelling)
      --read_kv_scales--> CheckpointKvScales (one K and one V scale per layer)
      --> the fp8 cache's Fp8Scales (tandem/engine/quant/kv_fp8.py), layer by layer

The fp8 cache writes and reads each layer's K and V under that layer's scales, as vLLM does
(the KV transfer layout names them all, so peers whose scales differ in any layer are
refused). They are used with ``--kv-cache-dtype fp8`` only; any other cache reads K and V
unquantized and leaves well-formed scales unused (logged).

Refused loudly, whatever the cache dtype (a malformed checkpoint is not served) (ModelLoadError naming the tensor), never guessed around: a scale that is not
one value (per-channel or per-head scales: the cache has no room for them), not finite or
not above 0, K's without V's, a layer without them while others have them, a layer outside
the model, two spellings for one layer. ``q_scale`` and ``prob_scale`` (an fp8 attention's
query and softmax scales) are read and left unused: attention here runs in a float dtype.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from tandem.engine.errors import ModelLoadError

_NAME = re.compile(
    r"^model\.layers\.(\d+)\.self_attn\."
    r"(?:(?P<kv>[kv])_scale|(?P<proj>[kv])_proj\.output_scale|(?P<unused>q_scale|prob_scale))$")


@dataclass(frozen=True, slots=True)
class CheckpointKvScales:
    """One K and one V scale per layer (``x = float(q) * scale``), layer order."""

    k: tuple[float, ...]
    v: tuple[float, ...]


def is_kv_scale(name: str) -> bool:
    """Whether ``name`` is a KV (or fp8 attention) scale tensor of a decoder layer."""
    return _NAME.match(name) is not None


def read_kv_scales(names: Iterable[str], get: Callable[[str], torch.Tensor],
                   num_layers: int) -> CheckpointKvScales | None:
    """The checkpoint's KV scales (None when it has none), each read through ``get``.
    Raises ModelLoadError for scales that cannot serve (see the module docstring)."""
    found: dict[str, dict[int, float]] = {"k": {}, "v": {}}
    for name in sorted(names):
        m = _NAME.match(name)
        if m is None:
            continue
        layer, tensor = int(m.group(1)), get(name)
        if m.group("unused"):
            continue
        which = m.group("kv") or m.group("proj")
        if layer >= num_layers:
            raise ModelLoadError(f"{name}: the model has {num_layers} layers")
        if layer in found[which]:
            raise ModelLoadError(f"{name}: layer {layer}'s {which}_scale is stored twice")
        found[which][layer] = _one_value(name, tensor)
    if not found["k"] and not found["v"]:
        return None
    for which, other in (("k", "v"), ("v", "k")):
        missing = sorted(set(range(num_layers)) - set(found[which]))
        if missing:
            why = f"{other}_scale" if not found[which] else f"other layers' {which}_scale"
            raise ModelLoadError(
                f"the checkpoint has {why} but no {which}_scale for layer {missing[0]} "
                f"(model.layers.{missing[0]}.self_attn.{which}_scale): fp8 KV scales must "
                "cover every layer, K and V")
    return CheckpointKvScales(tuple(found["k"][i] for i in range(num_layers)),
                              tuple(found["v"][i] for i in range(num_layers)))


def _one_value(name: str, tensor: torch.Tensor) -> float:
    if tensor.numel() != 1:
        raise ModelLoadError(
            f"{name} holds {tensor.numel()} values (shape {tuple(tensor.shape)}): per-channel "
            "or per-head KV scales are not supported (the fp8 cache keeps one scale for K "
            "and one for V in each layer)")
    value = float(tensor.float().reshape(()))
    if not (math.isfinite(value) and value > 0):
        raise ModelLoadError(f"{name} is {value}: a KV scale must be finite and > 0")
    return value
