"""Write a dense checkpoint out again as AWQ, GPTQ or compressed-tensors, for tests.

Each format's packer follows that format's own layout as its quantizer writes it (AutoAWQ's
``WQLinear_GEMM.from_linear``, AutoGPTQ's ``QuantLinear.pack``, compressed-tensors'
``pack_to_int32``), one nibble position at a time on numpy uint32 words. Nothing here imports
the engine's loader (tandem/engine/quant/prequantized): the tests compare the two.

    spec = QuantSpec("awq", group_size=128)
    ref = write_prequantized(dense_dir, out_dir, spec)   # out_dir: the pre-quantized checkpoint
    write_dense(dense_dir, ref_dir, ref)                  # ref_dir: float, the same weights

``ref`` maps every quantized checkpoint linear (``model.layers.0.self_attn.q_proj``) to its
reference dequantization ``(q - zero_point) * scale`` in fp32, exact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble i of a word holds column 8c + order[i]
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """Which format to write, and how."""

    method: str  # "awq" | "gptq" | "compressed-tensors"
    group_size: int = 128
    symmetric: bool = False
    bits: int = 4  # compressed-tensors only: 8 writes int8 per channel
    ct_format: str = "pack-quantized"  # compressed-tensors: or "int-quantized", "naive-quantized"
    gptq_format: str = "gptq"  # or "gptq_v2" (zero points stored without the v1 minus one)
    quantize_lm_head: bool = False  # compressed-tensors: an empty ignore list


def write_prequantized(src: Path, out: Path, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """Quantize the decoder linears of the dense checkpoint ``src`` into ``out``; returns the
    reference dequantized weight ``[N, K]`` of every quantized linear."""
    state = load_file(str(src / "model.safetensors"))
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    ref: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        prefix = name.removesuffix(".weight")
        if not _is_target(prefix, spec):
            tensors[name] = _bias_dtype(name, t, spec)
            continue
        if spec.bits == 8:
            q8, s8 = _quantize_int8(t, torch.bfloat16)
            tensors.update(_pack_ct_int8(prefix, q8, s8, spec))
            ref[prefix] = q8.float() * s8.float()[:, None]
            continue
        q, z, s = _quantize_int4(t, spec)
        g = spec.group_size
        ref[prefix] = (q.float() - z.float().repeat_interleave(g, 1)) * \
            s.float().repeat_interleave(g, 1)
        pack = {"awq": _pack_awq, "gptq": _pack_gptq, "compressed-tensors": _pack_ct_int4}
        tensors.update(pack[spec.method](prefix, q, z, s, spec))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(spec)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return ref


def write_dense(src: Path, out: Path, weights: dict[str, torch.Tensor], spec: QuantSpec) -> None:
    """Copy the dense checkpoint ``src`` to ``out`` with ``weights`` (prefix -> [N, K]) in
    place of those linears (and biases in the dtype the quantized checkpoint keeps)."""
    state = load_file(str(src / "model.safetensors"))
    for prefix, w in weights.items():
        state[prefix + ".weight"] = w.contiguous()
    state = {k: _bias_dtype(k, v, spec).float() if k.endswith(".bias") else v
             for k, v in state.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(src / "config.json", out / "config.json")


def quantization_config(spec: QuantSpec) -> dict[str, object]:
    """``config.json``'s ``quantization_config`` as each format's tooling writes it."""
    g = spec.group_size
    if spec.method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    if spec.method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": False,
                "sym": spec.symmetric, "damp_percent": 0.01, "true_sequential": True,
                "static_groups": False, "checkpoint_format": spec.gptq_format}
    weights: dict[str, object] = {
        "num_bits": spec.bits, "type": "int", "symmetric": spec.symmetric, "dynamic": False,
        "actorder": None, "observer": "minmax", "observer_kwargs": {}, "block_structure": None,
        "strategy": "group" if spec.bits == 4 else "channel",
        "group_size": g if spec.bits == 4 else None,
    }
    return {
        "quant_method": "compressed-tensors", "format": spec.ct_format,
        "quantization_status": "compressed", "global_compression_ratio": None,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": None, "output_activations": None}},
        "ignore": [] if spec.quantize_lm_head else ["lm_head"],
        "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
    }


def _is_target(prefix: str, spec: QuantSpec) -> bool:
    if prefix == "lm_head":
        return spec.quantize_lm_head
    return prefix.startswith("model.layers.") and prefix.rsplit(".", 1)[-1] in _LINEARS


def _bias_dtype(name: str, t: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    # AutoAWQ and AutoGPTQ keep biases in fp16.
    if name.endswith(".bias") and spec.method in ("awq", "gptq"):
        return t.half()
    return t


def _quantize_int4(
    w: torch.Tensor, spec: QuantSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max quantization: ``q`` [N, K] in 0..15, zero points ``z`` [N, G] and fp16 (bf16
    for compressed-tensors) scales ``s`` [N, G] with ``w ~ (q - z) * s``."""
    n, k = w.shape
    g = spec.group_size
    wg = w.float().view(n, k // g, g)
    dtype = torch.bfloat16 if spec.method == "compressed-tensors" else torch.float16
    if spec.symmetric:
        s = (wg.abs().amax(-1) / 7).clamp(min=1e-6).to(dtype)
        z = torch.full((n, k // g), 8, dtype=torch.int32)
    else:
        lo, hi = wg.amin(-1), wg.amax(-1)
        s = ((hi - lo) / 15).clamp(min=1e-6).to(dtype)
        z = torch.round(-lo / s.float()).clamp(0, 15).to(torch.int32)
        if spec.method == "gptq" and spec.gptq_format == "gptq":
            z = z.clamp(min=1)  # v1 stores z - 1 unsigned: z = 0 cannot be written
    q = torch.round(wg / s.float()[..., None]) + z[..., None]
    return q.clamp(0, 15).to(torch.int32).view(n, k), z, s


def _quantize_int8(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    s = (w.float().abs().amax(1) / 127).clamp(min=1e-6).to(dtype)
    q = torch.round(w.float() / s.float()[:, None]).clamp(-128, 127).to(torch.int8)
    return q, s


def _u32(t: torch.Tensor) -> np.ndarray:
    return t.numpy().astype(np.int64).astype(np.uint32)


def _i32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int32).copy())


def _pack_awq(prefix, q, z, s, spec) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM: qweight [K, N/8], qzeros [G, N/8], scales [G, N]."""
    intweight, zeros = _u32(q.t()), _u32(z.t())  # [K, N], [G, N]
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // 8), dtype=np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        qweight |= intweight[:, AWQ_ORDER[i]::8] << np.uint32(4 * i)
        qzeros |= zeros[:, AWQ_ORDER[i]::8] << np.uint32(4 * i)
    return {prefix + ".qweight": _i32(qweight), prefix + ".qzeros": _i32(qzeros),
            prefix + ".scales": s.t().contiguous()}


def _pack_gptq(prefix, q, z, s, spec) -> dict[str, torch.Tensor]:
    """AutoGPTQ: qweight [K/8, N] packed along K, qzeros [G, N/8] along N (v1: z - 1)."""
    intweight = _u32(q.t())  # [K, N]
    stored = z.t() - (1 if spec.gptq_format == "gptq" else 0)  # [G, N]
    zeros = _u32(stored)
    qweight = np.zeros((intweight.shape[0] // 8, intweight.shape[1]), dtype=np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        qweight |= intweight[i::8, :] << np.uint32(4 * i)
        qzeros |= zeros[:, i::8] << np.uint32(4 * i)
    k = intweight.shape[0]
    g_idx = torch.arange(k, dtype=torch.int32) // spec.group_size
    return {prefix + ".qweight": _i32(qweight), prefix + ".qzeros": _i32(qzeros),
            prefix + ".scales": s.t().contiguous(), prefix + ".g_idx": g_idx}


def _pack_ct_int4(prefix, q, z, s, spec) -> dict[str, torch.Tensor]:
    """pack-quantized int4: signed values q - 8 stored with offset 8 (so: q), 8 per word along
    K; asymmetric zero points (z - 8, stored as z) packed 8 per word along N."""
    stored = _u32(q)  # [N, K]
    n, k = stored.shape
    packed = np.zeros((n, k // 8), dtype=np.uint32)
    for i in range(8):
        packed |= stored[:, i::8] << np.uint32(4 * i)
    out = {prefix + ".weight_packed": _i32(packed), prefix + ".weight_scale": s.contiguous(),
           prefix + ".weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if not spec.symmetric:
        zs = _u32(z)  # [N, G]
        zp = np.zeros((-(-n // 8), zs.shape[1]), dtype=np.uint32)
        for i in range(8):
            zp |= zs[i::8, :] << np.uint32(4 * i)
        out[prefix + ".weight_zero_point"] = _i32(zp)
    return out


def _pack_ct_int8(prefix, q, s, spec) -> dict[str, torch.Tensor]:
    """int8 per channel: the int8 values as they are (int-/naive-quantized), or offset by
    128 and packed 4 per word along K (pack-quantized)."""
    scale = s[:, None].contiguous()  # [N, 1]
    if spec.ct_format != "pack-quantized":
        return {prefix + ".weight": q.contiguous(), prefix + ".weight_scale": scale}
    stored = _u32(q.to(torch.int32) + 128)  # [N, K] in 0..255
    n, k = stored.shape
    packed = np.zeros((n, k // 4), dtype=np.uint32)
    for i in range(4):
        packed |= stored[:, i::4] << np.uint32(8 * i)
    return {prefix + ".weight_packed": _i32(packed), prefix + ".weight_scale": scale,
            prefix + ".weight_shape": torch.tensor([n, k], dtype=torch.int64)}
