"""DeepSeek GGUFs (llama.cpp's ``deepseek2``; tandem/engine/gguf_deepseek.py): tiny perturbed
DeepSeek-V2 and V3 checkpoints (a dense first layer, then MoE layers with shared experts)
written as llama.cpp writes them (tandem/engine/testing/gguf_writer.py: ``attn_k_b`` /
``attn_v_b`` as its MLA graph wants them, or ``attn_kv_b`` as files of before it), served
greedy, fp32, token for token as transformers serves the same weights: the checkpoint itself
for an F32 file, the gguf package's dequantization of a Q8_0/Q4_0/Q4_1 one, whose expert
blocks the engine keeps. Refusals by name of what this engine does not compute, before
anything is converted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.errors import ModelLoadError, UnsupportedConfigError
from tandem.engine.gguf_deepseek import merge_kv_b
from tandem.engine.loader import gguf_metadata, gguf_spec, resolve_model
from tandem.engine.models.layers import SparseMoE
from tandem.engine.native import load
from tests.unit.engine._reference import engine_token_ids, hf_greedy

gguf_py = pytest.importorskip("gguf")
from tandem.engine.testing.gguf_writer import _split_kv_b, write_gguf  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MOE = {"num_layers": 3, "first_k_dense_replace": 1}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 0.8, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}
GROUPS = {"deepseek2.expert_group_count": 4, "deepseek2.expert_group_used_count": 2}
# name -> (arch, checkpoint options, write_gguf options)
CASES = {
    # softmax greedy routing, two shared experts, kv_b split for absorption (llama.cpp's MLA)
    "v2": ("deepseek_v2", MOE, {}),
    # the same, as files of before llama.cpp's MLA: attn_kv_b whole, per-head key lengths
    "v2-kv-b-whole": ("deepseek_v2", MOE, {"split_kv_b": False}),
    # q-LoRA, sigmoid scores + exp_probs_b, renormalised, x 2.5; ungrouped (no group keys)
    "v3": ("deepseek_v3", {**MOE, "n_group": 1, "topk_group": 1}, {}),
    # the file states groups: 2 of 4, as DeepSeek's router chooses
    "v3-groups": ("deepseek_v3", MOE, {"metadata": GROUPS}),
    # YaRN past the original 64 positions: llama.cpp's softmax scale
    "v3-yarn": ("deepseek_v3", {**MOE, "n_group": 1, "topk_group": 1, "rope_scaling": YARN}, {}),
}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(13)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (7, 40, 90)]


def _gguf(family_dir, tmp_path: Path, case: str, qtype: str = "F32") -> tuple[Path, Path]:
    arch, options, writer = CASES[case]
    checkpoint = family_dir(arch, **options)
    return checkpoint, write_gguf(checkpoint, tmp_path / f"{case}-{qtype}.gguf", qtype, **writer)


def _engine(make_engine, gguf: Path, cache: Path):
    return make_engine(model=str(gguf), cache_dir=str(cache), num_blocks=128, block_size=4,
                       dtype="float32")


@pytest.mark.parametrize("case", list(CASES))
def test_a_float_gguf_serves_the_checkpoints_tokens(family_dir, make_engine, tmp_path,
                                                    case: str) -> None:
    checkpoint, gguf = _gguf(family_dir, tmp_path, case)
    names = {t.name for t in gguf_py.GGUFReader(str(gguf)).tensors}
    split = CASES[case][2].get("split_kv_b", True)
    assert ("blk.0.attn_k_b.weight" in names) == split != ("blk.0.attn_kv_b.weight" in names)
    engine = _engine(make_engine, gguf, tmp_path / "cache")
    arch = CASES[case][0]
    assert engine.arch.model_type == arch and engine.arch.mla is not None
    assert [isinstance(layer.mlp, SparseMoE) for layer in engine.runner.model.layers] == [
        False, True, True]
    if case == "v3-groups":
        assert engine.arch.moe is not None and engine.arch.moe.n_group == 4
    prompts = _prompts()
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        assert tokens == hf_greedy(checkpoint, prompt, GREEDY.max_tokens), case


@pytest.mark.parametrize(("case", "qtype"), [("v2", "Q8_0"), ("v3", "Q4_0"), ("v2", "Q4_1")])
def test_a_quantized_gguf_serves_its_blocks(family_dir, make_engine, tmp_path, case: str,
                                            qtype: str) -> None:
    """The experts' and shared experts' blocks run as stored where the native kernels are
    built (the latent attention itself runs the torch forward); the tokens are transformers'
    on the gguf package's dequantization of the file."""
    _, gguf = _gguf(family_dir, tmp_path, case, qtype)
    types = {t.name: t.tensor_type.name for t in gguf_py.GGUFReader(str(gguf)).tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == qtype
    assert types["blk.1.attn_v_b.weight"] == qtype  # rows of kv_lora_rank: whole blocks
    cache = tmp_path / "cache"
    engine = _engine(make_engine, gguf, cache)
    if load() is not None:
        for layer in engine.runner.model.layers[1:]:
            modules = [layer.mlp.shared_expert.gate_up_proj, layer.mlp.shared_expert.down_proj]
            modules += [e.gate_up_proj for e in layer.mlp.experts]
            modules += [e.down_proj for e in layer.mlp.experts]
            assert {getattr(m, "format", None) for m in modules} == {qtype}
    dequantized = resolve_model(str(gguf), cache)
    prompts = _prompts()
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        assert tokens == hf_greedy(dequantized, prompt, GREEDY.max_tokens), (case, qtype)


def test_the_kv_b_split_merges_back_exactly(family_dir) -> None:
    """llama.cpp's split (k_b per head transposed, v_b) undone gives kv_b_proj bit for bit."""
    from safetensors.numpy import load_file

    checkpoint = family_dir("deepseek_v2", **MOE)
    config = {"num_attention_heads": 4, "qk_nope_head_dim": 16, "v_head_dim": 12}
    tensors = load_file(str(checkpoint / "model.safetensors"))
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    split = _split_kv_b({name: tensors[name]}, config)
    k_b, v_b = split[name.replace("kv_b", "k_b")], split[name.replace("kv_b", "v_b")]
    assert k_b.shape == (4, 32, 16) and v_b.shape == (4, 12, 32)
    assert np.array_equal(merge_kv_b(k_b, v_b), tensors[name])
    with pytest.raises(ModelLoadError, match="not one kv_b split"):
        merge_kv_b(k_b, v_b[:3])


def test_the_family_is_read_from_the_router(family_dir, tmp_path) -> None:
    for case, arch in (("v2", "deepseek_v2"), ("v3", "deepseek_v3")):
        _, gguf = _gguf(family_dir, tmp_path, case)
        metadata = gguf_metadata(gguf)
        assert gguf_spec(metadata).model_type == "deepseek_v2"  # one architecture for both
        assert metadata["deepseek2.expert_gating_func"] == (1 if arch == "deepseek_v2" else 2)


# -- refusals, before anything is converted ------------------------------------------------

@pytest.mark.parametrize(("key", "value"), [
    ("deepseek2.rope.scaling.type", "linear"),
    ("deepseek2.nextn_predict_layers", 1),
    ("deepseek2.expert_gating_func", 3),
    ("deepseek2.expert_weights_norm", 1),  # a softmax router renormalised
    ("deepseek2.attention.sliding_window", 64),
])
def test_a_forward_changing_key_is_refused_by_name(family_dir, tmp_path, key: str,
                                                   value: object) -> None:
    arch, options, _ = CASES["v2"]
    gguf = write_gguf(family_dir(arch, **options), tmp_path / "m.gguf",
                      metadata={key: value})
    with pytest.raises(UnsupportedConfigError) as err:
        resolve_model(str(gguf), tmp_path / "cache")
    assert err.value.field == key
    assert not any((tmp_path / "cache" / "models").iterdir())  # nothing half-converted kept


@pytest.mark.parametrize(("extra", "message"), [
    ("blk.0.attn_k.weight", "'blk.0.attn_k.weight' has no place"),
    ("blk.2.attn_q_a.bias", "'blk.2.attn_q_a.bias' has no place"),
    ("blk.3.attn_k_b.weight", "without their attn_k_b/attn_v_b pair"),  # its v_b missing
])
def test_a_tensor_with_no_place_is_refused_by_name(family_dir, tmp_path, extra: str,
                                                   message: str) -> None:
    arch, options, _ = CASES["v2"]
    shape = (4, 32, 16) if "k_b" in extra else (8, 64)
    gguf = write_gguf(family_dir(arch, **options), tmp_path / "m.gguf",
                      extra_tensors={extra: np.ones(shape, np.float32)})
    with pytest.raises(ModelLoadError, match=message):
        resolve_model(str(gguf), tmp_path / "cache")


def test_the_tokenizer_a_deepseek_gguf_carries_is_kept(tmp_path) -> None:
    """A gpt2-BPE vocabulary in ``tokenizer.ggml.*`` (as DeepSeek's GGUFs carry theirs)
    becomes the converted directory's tokenizer: its merges and special tokens hold."""
    from transformers import AutoTokenizer

    from tandem.engine.gguf_deepseek import save_gguf_tokenizer

    path = tmp_path / "tok.gguf"
    writer = gguf_py.GGUFWriter(str(path), "deepseek2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c", "ab", "abc", "<s>", "</s>", "Ġ", "Ġa"])
    writer.add_token_types([1] * 5 + [3, 3] + [1, 1])
    writer.add_token_merges(["a b", "ab c", "Ġ a"])
    writer.add_bos_token_id(5)
    writer.add_eos_token_id(6)
    writer.add_tensor("token_embd.weight", np.ones((9, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_gguf_tokenizer(path, tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer("abc a")["input_ids"] == [4, 8]  # "abc" merged whole, " a" as Ġa
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")


def test_a_file_without_a_token_embedding_is_refused_by_name() -> None:
    """The vocabulary comes from token_embd.weight's shape: a file without it is a load error
    naming it (not a KeyError), for DeepSeek's and the other MoE families' GGUFs alike."""
    from tandem.engine.gguf_deepseek import vocab_size

    assert vocab_size({"token_embd.weight": (300, 64)}) == 300
    with pytest.raises(ModelLoadError, match="token_embd.weight"):
        vocab_size({"output.weight": (300, 64)})
