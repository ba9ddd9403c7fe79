"""Write a dense checkpoint out again in FP8 (``quant_method: fp8``), for tests.

The decoder linears (attention, MLA's projections, MLP, experts) become ``float8_e4m3fn`` with the scales the
format stores, written the way DeepSeek-V3's and Qwen3-FP8's exports hold them; ``lm_head``,
norms, embeddings and routers stay float (``modules_to_not_convert``). Nothing here imports
the engine's loader (tandem/engine/quant/prequantized/fp8.py): the tests compare the two.

    ref = write_fp8(dense_dir, out_dir, block=(48, 32))    # block-wise weight_scale_inv
    ref = write_fp8(dense_dir, out_dir, block=None)        # one weight_scale per tensor
    write_dequantized(dense_dir, ref_dir, ref)             # float, the same weights

``ref`` maps every quantized linear (``model.layers.0.self_attn.q_proj``) to the format's
reference dequantization ``weight.float() * scale`` (block-wise broadcast) in fp32.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
            "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")  # the last: MLA's
E4M3_MAX = 448.0


def write_fp8(src: Path, out: Path, block: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    """Quantize the decoder linears of the dense checkpoint ``src`` into ``out``; returns the
    reference dequantized weight ``[N, K]`` of each."""
    state = load_file(str(src / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    ref: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        prefix = name.removesuffix(".weight")
        if not (prefix.startswith("model.layers.") and prefix.rsplit(".", 1)[-1] in _LINEARS
                and name.endswith(".weight")):
            tensors[name] = t
            continue
        w = t.float()
        if block is None:
            scale = (w.abs().amax() / E4M3_MAX).clamp(min=1e-12)  # []
            q = (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            tensors[name], tensors[prefix + ".weight_scale"] = q, scale.reshape(1)
            ref[prefix] = q.float() * scale
            continue
        bn, bk = block
        n, k = w.shape
        rows, cols = -(-n // bn), -(-k // bk)
        scale_inv = torch.empty(rows, cols)
        for i in range(rows):
            for j in range(cols):
                tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
                scale_inv[i, j] = (tile.abs().amax() / E4M3_MAX).clamp(min=1e-12)
        wide = torch.empty(n, k)
        for i in range(rows):
            for j in range(cols):
                wide[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = scale_inv[i, j]
        q = (w / wide).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        tensors[name], tensors[prefix + ".weight_scale_inv"] = q, scale_inv
        ref[prefix] = q.float() * wide
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    qc: dict[str, object] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                             "fmt": "e4m3", "modules_to_not_convert": ["lm_head"]}
    if block is not None:
        qc["weight_block_size"] = list(block)
    config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return ref


def write_dequantized(src: Path, out: Path, weights: dict[str, torch.Tensor]) -> None:
    """Copy the dense checkpoint ``src`` to ``out`` with ``weights`` (prefix -> [N, K]) in
    place of those linears: the float checkpoint transformers runs as the reference."""
    state = load_file(str(src / "model.safetensors"))
    for prefix, w in weights.items():
        state[prefix + ".weight"] = w.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(src / "config.json", out / "config.json")
