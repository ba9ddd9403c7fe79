"""Read a GGUF checkpoint's quantized tensors as they are stored, mapped to our modules.

    GGUF blk.i.attn_{q,k,v}  --rows un-permuted (q, k), concatenated-->  layers.i.self_attn.qkv_proj
    GGUF blk.i.ffn_{gate,up}  --concatenated-->                         layers.i.mlp.gate_up_proj
    GGUF blk.i.attn_output / ffn_down                                   o_proj / down_proj
    GGUF token_embd / output                                            embed_tokens / lm_head
    GGUF blk.i.ffn_{gate,up}_exps [E, I, ...]  --expert e's rows, concatenated-->
                                                        layers.i.mlp.experts.e.gate_up_proj
    GGUF blk.i.ffn_down_exps [E, hidden, ...]  --expert e's rows-->  layers.i.mlp.experts.e.down_proj
    GGUF blk.i.ffn_{gate,up,down}_shexp                 layers.i.mlp.shared_expert.* (as the MLP)
    GGUF blk.i.ffn_{gate,up,down}.e (Mixtral GGUFs of 2023: one tensor per expert)  as stacked

Types read here: Q4_0, Q4_1 and Q8_0 (blocks of 32 values with fp16 scales), the ones the
native kernels run as they are; a fused module appears only when all its parts share one type.
Anything else (F16, K-quants, ...) is left to the dequantized checkpoint (tandem/engine/loader.py).

llama.cpp's converter permutes the rows of Q and K for its interleaved RoPE; transformers
undoes that when it dequantizes (``_reverse_permute_weights``). A row of a block-quantized
tensor is a self-contained run of blocks, so the same row permutation applies to the raw
bytes: no value is touched, nothing goes through floats.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tandem.engine.errors import ModelLoadError
from tandem.engine.gguf_moe import unpermute_rows
from tandem.engine.loader import ALIASES, _alias_path
from tandem.engine.models.arch import ModelArch

BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")
_PARTS = {
    "self_attn.qkv_proj": ["attn_q", "attn_k", "attn_v"],
    "self_attn.o_proj": ["attn_output"],
    "mlp.gate_up_proj": ["ffn_gate", "ffn_up"],
    "mlp.down_proj": ["ffn_down"],
    "mlp.shared_expert.gate_up_proj": ["ffn_gate_shexp", "ffn_up_shexp"],
    "mlp.shared_expert.down_proj": ["ffn_down_shexp"],
}
# a MoE layer's experts, stacked on the first axis of one GGUF tensor per part
_EXPERT_PARTS = {
    "gate_up_proj": ["ffn_gate_exps", "ffn_up_exps"],
    "down_proj": ["ffn_down_exps"],
}


@dataclass(frozen=True, slots=True)
class Blocks:
    """One module's weight as stored: ``rows`` ``[N, K/32 * block bytes]`` uint8 of ``type``."""

    type: str  # Q4_0 | Q4_1 | Q8_0
    rows: np.ndarray


def gguf_source(spec: str) -> Path | None:
    """The GGUF file behind a model spec (alias or ``.gguf`` path), None for HF directories."""
    if spec in ALIASES:
        return _alias_path(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    return None


def tensor_types(path: Path) -> dict[str, str]:
    """GGUF tensor name -> its type name (``F32``, ``Q4_1``, ``Q6_K``, ...)."""
    reader = _reader(path)
    return {t.name: t.tensor_type.name for t in reader.tensors}


def _reader(path: Path):  # -> gguf.GGUFReader
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError("reading GGUF blocks needs the gguf package")
    import gguf

    return gguf.GGUFReader(str(path))


def read_blocks(path: Path, arch: ModelArch, types: tuple[str, ...] = BLOCK_TYPES,
                experts: range | None = None) -> dict[str, Blocks]:
    """Stored blocks keyed by our module name (``layers.3.self_attn.qkv_proj``,
    ``embed_tokens``, ``lm_head``) for every module whose GGUF tensors are all of one type in
    ``types``; of a MoE layer's routed experts only ``experts`` (None: all; one rank's under
    expert parallelism: no other expert's blocks are copied out of the file)."""
    reader = _reader(path)
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for t in reader.tensors:
        name = t.tensor_type.name
        if name in types:
            raw[t.name] = (name, np.asarray(t.data))  # [N, K/32 * bytes] uint8 (a mmap view)
    field = reader.fields["general.architecture"]
    permuted = bytes(field.parts[field.data[0]]).decode() == "llama"  # as transformers decides
    out: dict[str, Blocks] = {}
    for ours, theirs in (("embed_tokens", "token_embd.weight"), ("lm_head", "output.weight")):
        if theirs in raw:
            out[ours] = Blocks(*raw[theirs])
    for i in range(arch.num_layers):
        for ours, parts in _PARTS.items():
            names = [f"blk.{i}.{n}.weight" for n in parts]
            if not all(n in raw for n in names) or len({raw[n][0] for n in names}) != 1:
                continue
            rows = []
            for short, name in zip(parts, names, strict=True):
                r = raw[name][1]
                if permuted and short == "attn_q":
                    r = unpermute_rows(r, arch.num_heads)
                elif permuted and short == "attn_k":
                    r = unpermute_rows(r, arch.num_kv_heads)
                rows.append(r)
            out[f"layers.{i}.{ours}"] = Blocks(raw[names[0]][0], np.concatenate(rows, axis=0))
        for ours, parts in _EXPERT_PARTS.items():
            names = [f"blk.{i}.{n}.weight" for n in parts]
            if not all(n in raw for n in names) or len({raw[n][0] for n in names}) != 1:
                continue
            stacked = [raw[n][1] for n in names]  # each [E, rows, K/32 * block bytes]
            for e in experts if experts is not None else range(stacked[0].shape[0]):
                out[f"layers.{i}.mlp.experts.{e}.{ours}"] = Blocks(
                    raw[names[0]][0], np.concatenate([s[e] for s in stacked], axis=0))
        every = range(arch.moe.num_experts if arch.moe is not None else 0)
        for e in experts if experts is not None else every:
            for ours, parts in _PARTS.items():  # one tensor per expert (Mixtral GGUFs of 2023)
                if not ours.startswith("mlp.") or "shared" in ours:
                    continue
                names = [f"blk.{i}.{n}.{e}.weight" for n in parts]
                if all(n in raw for n in names) and len({raw[n][0] for n in names}) == 1:
                    out[f"layers.{i}.mlp.experts.{e}.{ours[4:]}"] = Blocks(
                        raw[names[0]][0], np.concatenate([raw[n][1] for n in names], axis=0))
    return out


def read_q4_1_layers(path: Path, arch: ModelArch) -> dict[str, np.ndarray]:
    """Raw Q4_1 rows ``[N, K/32 * 20]`` of the decoder's linear layers, by module name."""
    return {k: b.rows for k, b in read_blocks(path, arch, ("Q4_1",)).items()
            if k.startswith("layers.")}
