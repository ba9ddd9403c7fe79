"""Read a GGUF checkpoint's Q4_1 linear weights as they are stored, mapped to our layers.

    GGUF blk.i.attn_{q,k,v}  --rows un-permuted (q, k), concatenated-->  layers.i.qkv_proj
    GGUF blk.i.ffn_{gate,up}  --concatenated-->                         layers.i.gate_up_proj
    GGUF blk.i.attn_output / ffn_down                                   o_proj / down_proj

llama.cpp's converter permutes the rows of Q and K for its interleaved RoPE; transformers
undoes that when it dequantizes (``_reverse_permute_weights``). A row of a Q4_1 tensor is a
self-contained run of blocks, so the same row permutation applies to the raw bytes: no value
is touched, nothing goes through floats.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from engine.errors import ModelLoadError
from engine.loader import ALIASES, _alias_path
from engine.models.arch import ModelArch


def gguf_source(spec: str) -> Path | None:
    """The GGUF file behind a model spec (alias or ``.gguf`` path), None for HF directories."""
    if spec in ALIASES:
        return _alias_path(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    return None


def _reverse_permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' ``_reverse_permute_weights`` on whole rows (any row payload)."""
    dim = rows.shape[0] // n_head // 2
    w = rows.reshape(n_head, dim, 2, *rows.shape[1:])
    return w.swapaxes(2, 1).reshape(rows.shape)


def read_q4_1_layers(path: Path, arch: ModelArch) -> dict[str, np.ndarray]:
    """Raw Q4_1 rows ``[N, K/32 * 20]`` uint8 keyed by our module name
    (``layers.3.self_attn.qkv_proj``); only fused layers whose parts are all Q4_1 appear."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError("reading GGUF blocks needs the gguf package")
    import gguf

    reader = gguf.GGUFReader(str(path))
    raw: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            raw[t.name] = np.asarray(t.data)  # [N, K/32 * 20] uint8 (a view of the mmap)
    field = reader.fields["general.architecture"]
    permuted = bytes(field.parts[field.data[0]]).decode() == "llama"  # as transformers decides
    out: dict[str, np.ndarray] = {}
    for i in range(arch.num_layers):
        p = f"blk.{i}."
        parts = {
            "self_attn.qkv_proj": ["attn_q", "attn_k", "attn_v"],
            "self_attn.o_proj": ["attn_output"],
            "mlp.gate_up_proj": ["ffn_gate", "ffn_up"],
            "mlp.down_proj": ["ffn_down"],
        }
        for ours, theirs in parts.items():
            names = [f"{p}{n}.weight" for n in theirs]
            if not all(n in raw for n in names):
                continue
            rows = []
            for short, name in zip(theirs, names, strict=True):
                r = raw[name]
                if permuted and short == "attn_q":
                    r = _reverse_permute_rows(r, arch.num_heads)
                elif permuted and short == "attn_k":
                    r = _reverse_permute_rows(r, arch.num_kv_heads)
                rows.append(r)
            out[f"layers.{i}.{ours}"] = np.concatenate(rows, axis=0)
    return out
