"""Pre-quantized checkpoints (AWQ, GPTQ, compressed-tensors) load exactly (FP8 has its own file).

Checkpoints are written by tandem/engine/testing/prequantized.py, whose packers follow each format's
layout independently of the loader; every loaded layer must dequantize to the format's
reference ``(q - zero_point) * scale`` bit for bit, and the model must compute what a float
model holding those reference weights computes. Unsupported variants are refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine.attention import AttentionMetadata, get_backend
from tandem.engine.errors import ModelLoadError
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.weights import load_model
from tandem.engine.quant import Int4Linear, Int8Linear
from tandem.engine.quant.prequantized import (
    AwqFormat,
    CompressedTensorsFormat,
    GptqFormat,
    detect_format,
    format_from_config,
    read_quantization_config,
)
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.testing import make_tiny_checkpoint
from tandem.engine.testing.prequantized import (
    QuantSpec,
    quantization_config,
    write_dense,
    write_prequantized,
)
from tests.unit.engine._reference import engine_token_ids

CPU = torch.device("cpu")
HIDDEN = 128  # K >= 128 everywhere, so groups of 32, 64 and 128 all fit

SPECS = {
    **{f"awq-g{g}": QuantSpec("awq", g) for g in (32, 64, 128)},
    **{f"gptq-g{g}-{'sym' if s else 'asym'}": QuantSpec("gptq", g, s)
       for g in (32, 64, 128) for s in (True, False)},
    "gptq_v2-g64-asym": QuantSpec("gptq", 64, gptq_format="gptq_v2"),
    **{f"ct-int4-g{g}-{'sym' if s else 'asym'}": QuantSpec("compressed-tensors", g, s)
       for g in (32, 64, 128) for s in (True, False)},
    **{f"ct-int8-{f}": QuantSpec("compressed-tensors", bits=8, symmetric=True, ct_format=f)
       for f in ("pack-quantized", "int-quantized", "naive-quantized")},
    "ct-int4-g32-lm_head": QuantSpec("compressed-tensors", 32, quantize_lm_head=True),
}
PARTS = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
         "self_attn.o_proj": ["self_attn.o_proj"],
         "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
         "mlp.down_proj": ["mlp.down_proj"]}


@dataclass
class Variant:
    """One spec's checkpoints, and their models loaded on first use (a forward changes
    neither, so tests share them)."""

    qdir: Path
    refdir: Path
    ref: dict[str, torch.Tensor]  # checkpoint linear -> reference dequantized weight
    _models: dict[Path, CausalLM] = field(default_factory=dict)

    def model(self, path: Path) -> CausalLM:
        if path not in self._models:
            self._models[path] = _load(path)
        return self._models[path]

    @property
    def quant(self) -> CausalLM:
        return self.model(self.qdir)

    @property
    def dense(self) -> CausalLM:
        return self.model(self.refdir)


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory):
    """``variant(spec name, arch)``: that spec's checkpoints, written once per module."""
    dense: dict[str, Path] = {}
    made: dict[tuple[str, str], Variant] = {}

    def get(name: str, arch: str = "llama") -> Variant:
        if arch not in dense:
            path = tmp_path_factory.mktemp(f"dense-{arch}")
            dense[arch] = make_tiny_checkpoint(path, arch=arch, hidden_size=HIDDEN)
        if (name, arch) not in made:
            spec, root = SPECS[name], tmp_path_factory.mktemp(f"{name}-{arch}")
            ref = write_prequantized(dense[arch], root / "q", spec)
            write_dense(dense[arch], root / "ref", ref, spec)
            made[name, arch] = Variant(root / "q", root / "ref", ref)
        return made[name, arch]

    return get


def _load(path: Path) -> CausalLM:
    return load_model(path, torch.float32, CPU, 256, progress=False)[0]


def _logits(model, ids: list[int]) -> torch.Tensor:  # [T, V]
    """One prefill of ``ids`` through the paged forward (torch backend)."""
    arch, t, bs = model.arch, len(ids), 16
    blocks = -(-t // bs)
    kv = torch.zeros(arch.num_layers, 2, blocks, bs, arch.num_kv_heads, arch.head_dim)
    meta = AttentionMetadata.build([t], [t], [list(range(blocks))], list(range(t)), bs, CPU)
    with torch.no_grad():
        h = model(torch.tensor(ids), torch.arange(t), kv, meta, get_backend("torch"))
        return model.compute_logits(h)


# --- each format's layout on hand-made words ----------------------------------------------

class _Dict(dict):
    def get(self, name: str) -> torch.Tensor:  # type: ignore[override]
        return self[name]


WORD = 0x76543210  # nibble i holds the value i


def test_awq_nibble_order() -> None:
    """AutoAWQ packs columns 0, 2, 4, 6, 1, 3, 5, 7 into nibbles 0..7."""
    k, g = 32, 32
    t = _Dict({"x.qweight": torch.full((k, 1), WORD, dtype=torch.int32),
               "x.qzeros": torch.full((1, 1), 0x11111111, dtype=torch.int32),
               "x.scales": torch.ones(1, 8, dtype=torch.float16)})
    w = AwqFormat(g).unpack("x", t)
    assert w.q[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # column n of row k = 0
    assert torch.equal(w.dequantize()[:, 0], torch.tensor([-1.0, 3, 0, 4, 1, 5, 2, 6]))


def test_gptq_packs_k_and_v1_zeros_carry_minus_one() -> None:
    k, g = 32, 32
    t = _Dict({"x.qweight": torch.full((k // 8, 8), WORD, dtype=torch.int32),
               "x.qzeros": torch.tensor([[WORD]], dtype=torch.int32),
               "x.scales": torch.full((1, 8), 0.5, dtype=torch.float16)})
    w = GptqFormat(g, False, zero_offset=1).unpack("x", t)
    assert w.q[0, :8].tolist() == list(range(8))  # packed along K
    dq = w.dequantize()  # [N, K]; the zero point of output n is n + 1
    assert torch.equal(dq[0, :8], (torch.arange(8.0) - 1) * 0.5)
    assert torch.equal(dq[:, 0], -torch.arange(1.0, 9) * 0.5)
    v2 = GptqFormat(g, False, zero_offset=0).unpack("x", t).dequantize()
    assert torch.equal(v2[:, 0], -torch.arange(8.0) * 0.5)


def test_compressed_tensors_offsets_and_zero_point_packing() -> None:
    n, k, g = 8, 32, 32
    cfg = quantization_config(QuantSpec("compressed-tensors", g, symmetric=False))
    fmt = format_from_config(cfg)
    t = _Dict({"x.weight_packed": torch.full((n, k // 8), WORD, dtype=torch.int32),
               "x.weight_scale": torch.ones(n, 1, dtype=torch.bfloat16),
               "x.weight_zero_point": torch.tensor([[WORD]], dtype=torch.int32),
               "x.weight_shape": torch.tensor([n, k])})
    w = fmt.unpack("x", t)
    # stored weight i -> signed i - 8; stored zero point of row n -> signed n - 8
    assert torch.equal(w.dequantize()[:, :8],
                       torch.arange(8.0)[None, :] - torch.arange(8.0)[:, None])


# --- whole checkpoints ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SPECS))
def test_layers_dequantize_to_the_reference(variant, name: str) -> None:
    v = variant(name)
    model, ref, spec = v.quant, v.ref, SPECS[name]
    kind = Int4Linear if spec.bits == 4 else Int8Linear
    assert model.quant_format == detect_format(v.qdir).label != "none"
    for i, layer in enumerate(model.layers):
        for ours, parts in PARTS.items():
            lin = layer.get_submodule(ours)
            assert isinstance(lin, kind), (i, ours)
            want = torch.cat([ref[f"model.layers.{i}.{p}"] for p in parts])
            assert torch.equal(lin.dequantize(), want), (i, ours)
            if spec.bits == 4:
                assert lin.group_size == spec.group_size
    if spec.quantize_lm_head:
        assert torch.equal(model.lm_head.dequantize(), ref["lm_head"])
    else:
        assert not isinstance(model.lm_head, Int4Linear | Int8Linear)


# Every format, every group size, sym and asym, int8 in each container, a quantized lm_head.
LOGITS = ["awq-g128", "gptq-g32-sym", "gptq-g64-asym", "gptq_v2-g64-asym", "ct-int4-g64-asym",
          "ct-int4-g128-sym", "ct-int8-int-quantized", "ct-int8-pack-quantized",
          "ct-int4-g32-lm_head"]


@pytest.mark.parametrize("name", LOGITS)
def test_logits_equal_the_float_model(variant, name: str) -> None:
    quant, dense = variant(name).quant, variant(name).dense
    ids = torch.randint(3, 256, (80,), generator=torch.Generator().manual_seed(0)).tolist()
    # >= 64 rows: the quantized layers run the fp32 GEMM on their dequantized weights.
    torch.testing.assert_close(_logits(quant, ids), _logits(dense, ids), rtol=1e-5, atol=1e-5)
    # Few rows: torch's CPU int4 / int8 kernels (bf16 activations and scales).
    got, want = _logits(quant, ids[:5]), _logits(dense, ids[:5])
    assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_qkv_bias_of_a_quantized_qwen2(variant) -> None:
    v = variant("awq-g64", "qwen2")
    quant, dense = v.quant, v.dense
    qkv = quant.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Int4Linear) and qkv.bias is not None
    assert torch.equal(qkv.bias, dense.layers[0].self_attn.qkv_proj.bias)
    ids = list(range(3, 83))
    torch.testing.assert_close(_logits(quant, ids), _logits(dense, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["awq-g32", "gptq-g128-asym", "ct-int8-pack-quantized"])
def test_engine_greedy_equals_the_float_model(variant, make_engine, name: str) -> None:
    """Through the whole engine (on the CPU: the native fused forward for small steps)."""
    qdir, refdir = variant(name).qdir, variant(name).refdir
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 17, 33, 101, 7], list(range(40, 110))]
    got = engine_token_ids(make_engine(model=str(qdir), num_blocks=32), prompts, params)
    want = engine_token_ids(make_engine(model=str(refdir), num_blocks=32), prompts, params)
    assert got == want


def test_engine_keeps_the_format_and_names_it(variant, make_engine) -> None:
    """``auto`` (the default) keeps the stored layers (the native kernels' layout on the CPU)
    and reports the format; ``none`` dequantizes them exactly; int4/int8 are refused."""
    v = variant("awq-g32")
    engine = make_engine(model=str(v.qdir), num_blocks=8)
    assert engine.weights_format.startswith("awq-int4-g32 x")
    qkv = engine.runner.model.layers[0].self_attn.qkv_proj
    dense = make_engine(model=str(v.qdir), num_blocks=8, quantization="none")
    assert dense.weights_format == "unquantized"
    ref = dense.runner.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(qkv.dequantize(), ref)
    for method in ("int4", "int8"):
        with pytest.raises(ModelLoadError, match="already quantized"):
            make_engine(model=str(v.qdir), num_blocks=8, quantization=method)


# --- refusals ------------------------------------------------------------------------------

def _ct(**weights: object) -> dict:
    cfg = quantization_config(QuantSpec("compressed-tensors", 128))
    cfg["config_groups"]["group_0"]["weights"].update(weights)
    return cfg


def _with(cfg: dict, **kv: object) -> dict:
    return {**cfg, **kv}


AWQ = quantization_config(QuantSpec("awq", 128))
GPTQ = quantization_config(QuantSpec("gptq", 128))
CT = quantization_config(QuantSpec("compressed-tensors", 128))
W8A8 = json.loads(json.dumps(CT))
W8A8["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "int",
                                                          "strategy": "token", "dynamic": True}
REFUSED = {
    "bitsandbytes": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    "fp8-static": ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8.*static"),
    "awq-3bit": (_with(AWQ, bits=3), "awq.*3-bit"),
    "awq-gemv": (_with(AWQ, version="gemv"), "awq.*gemv"),
    "awq-no-zero-point": (_with(AWQ, zero_point=False), "awq.*zero_point"),
    "awq-group-256": (_with(AWQ, group_size=256), "awq.*group size 256"),
    "gptq-8bit": (_with(GPTQ, bits=8), "gptq.*8-bit"),
    "gptq-desc-act": (_with(GPTQ, desc_act=True), "gptq.*desc_act"),
    "gptq-marlin": (_with(GPTQ, checkpoint_format="marlin"), "gptq.*marlin"),
    "gptq-channel": (_with(GPTQ, group_size=-1), "gptq.*group size -1"),
    "ct-activations": (W8A8, "compressed-tensors.*activation quantization"),
    "ct-fp8": (_ct(type="float", num_bits=8, strategy="channel", group_size=None),
               "compressed-tensors.*float weights"),
    "ct-actorder-group": (_ct(actorder="group"), "compressed-tensors.*actorder 'group'"),
    "ct-int8-group": (_ct(num_bits=8, group_size=128), "compressed-tensors.*int8 with strategy"),
    "ct-int8-asym": (_ct(num_bits=8, strategy="channel", group_size=None, symmetric=False),
                     "compressed-tensors.*asymmetric int8"),
    "ct-2bit": (_ct(num_bits=2), "compressed-tensors.*2-bit"),
    "ct-nvfp4": (_with(CT, format="nvfp4-pack-quantized"), "compressed-tensors.*nvfp4"),
    "ct-sparse": (_with(CT, sparsity_config={"format": "sparse-24-bitmask"}),
                  "compressed-tensors.*sparsity"),
    "ct-kv-cache": (_with(CT, kv_cache_scheme={"num_bits": 8, "type": "float"}),
                    "compressed-tensors.*KV cache"),
    "ct-frozen": (_with(CT, quantization_status="frozen"), "compressed-tensors.*frozen"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_formats_are_refused_by_name(name: str) -> None:
    cfg, pattern = REFUSED[name]
    with pytest.raises(ModelLoadError, match=pattern) as err:
        format_from_config(cfg)
    assert "Supported: awq" in str(err.value)


def test_act_order_g_idx_is_refused(variant, tmp_path: Path) -> None:
    qdir = variant("gptq-g32-asym").qdir
    state = load_file(str(qdir / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.g_idx"
    state[name] = state[name].flip(0).contiguous()  # groups permuted, desc_act still false
    (tmp_path / "config.json").write_text((qdir / "config.json").read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="gptq.*act-order"):
        _load(tmp_path)


def test_quantized_tensors_without_a_config_are_refused(variant, tmp_path: Path) -> None:
    qdir = variant("awq-g128").qdir
    config = json.loads((qdir / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(qdir / "model.safetensors")
    with pytest.raises(ModelLoadError, match="qweight looks pre-quantized"):
        _load(tmp_path)


def test_older_exports_keep_the_settings_beside_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert read_quantization_config(tmp_path) is None
    (tmp_path / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 64, "desc_act": False, "sym": True}))
    assert detect_format(tmp_path) == GptqFormat(64, True, zero_offset=1)


def test_compressed_tensors_targets_and_ignore() -> None:
    cfg = quantization_config(QuantSpec("compressed-tensors", 64))
    cfg["config_groups"]["group_0"]["targets"] = ["re:.*mlp\\..*_proj$"]
    cfg["ignore"] = ["model.layers.1.mlp.down_proj"]
    fmt = format_from_config(cfg)
    assert isinstance(fmt, CompressedTensorsFormat)
    assert fmt.label == "compressed-tensors-int4-g64-asym"
    assert fmt.scheme("model.layers.0.mlp.down_proj") is not None
    assert fmt.scheme("model.layers.1.mlp.down_proj") is None
    assert fmt.scheme("model.layers.0.self_attn.q_proj") is None


# --- the compressed-tensors package itself, when installed ----------------------------------

@pytest.mark.parametrize("name", ["ct-int4-g32-asym", "ct-int4-g128-sym", "ct-int8-pack-quantized"])
def test_compressed_tensors_package_reads_our_checkpoints(variant, name: str) -> None:
    """The package's own unpack + dequantize of our written tensors agree with the loader
    (its dequantization runs in the bf16 of the scales: ours, rounded once, equals it)."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    v = variant(name)
    config = json.loads((v.qdir / "config.json").read_text())["quantization_config"]
    args = QuantizationArgs.model_validate(config["config_groups"]["group_0"]["weights"])
    assert QuantizationConfig.model_validate(config).format == "pack-quantized"
    state = load_file(str(v.qdir / "model.safetensors"))
    bits = SPECS[name].bits
    p = "model.layers.0.mlp.down_proj"
    shape = torch.Size(state[p + ".weight_shape"].tolist())
    q = unpack_from_int32(state[p + ".weight_packed"], bits, shape)
    scale = state[p + ".weight_scale"]
    zp = None
    if p + ".weight_zero_point" in state:
        zp = unpack_from_int32(state[p + ".weight_zero_point"], bits,
                               torch.Size([shape[0], scale.shape[1]]), packed_dim=0)
    theirs = dequantize(q, scale, zp, args=args)
    ours = v.quant.layers[0].mlp.down_proj.dequantize()
    assert theirs.dtype == torch.bfloat16
    assert torch.equal(ours.to(torch.bfloat16), theirs)


@pytest.mark.parametrize("name", ["awq-g64", "gptq-g32-sym", "ct-int8-pack-quantized"])
def test_quantized_experts_of_a_qwen3_moe(variant, name: str) -> None:
    """A MoE checkpoint's quantized experts load as the experts' linears, exactly (the router
    stays float), and the model computes what the float one with those weights computes."""
    v = variant(name, "qwen3_moe")
    quant, dense = v.quant, v.dense
    kind = Int4Linear if SPECS[name].bits == 4 else Int8Linear
    moe = quant.layers[1].mlp
    assert len(moe.experts) == 8
    for e, expert in enumerate(moe.experts):
        p = f"model.layers.1.mlp.experts.{e}."
        assert isinstance(expert.gate_up_proj, kind) and isinstance(expert.down_proj, kind)
        assert torch.equal(expert.gate_up_proj.dequantize(),
                           torch.cat([v.ref[p + "gate_proj"], v.ref[p + "up_proj"]]))
        assert torch.equal(expert.down_proj.dequantize(), v.ref[p + "down_proj"])
    assert moe.gate.weight.dtype == torch.float32
    # an expert gets ~20 of the 80 rows: torch's few-row int4/int8 kernels (bf16
    # activations), whose rounding the next layers' routers may turn into another expert
    got, want = _logits(quant, list(range(3, 83))), _logits(dense, list(range(3, 83)))
    assert ((got - want).norm() / want.norm()).item() < 5e-2
