"""Which checkpoint tensors fill which of our parameters. Torch-free.

    checkpoint (HF names)                         ours (causal_lm.py)
    model.embed_tokens.weight                 ->  embed_tokens.weight
    model.layers.i.self_attn.{q,k,v}_proj.*   ->  layers.i.self_attn.qkv_proj  (rows stacked)
    model.layers.i.self_attn.o_proj.*         ->  layers.i.self_attn.o_proj
    model.layers.i.self_attn.{q,k}_norm.weight->  layers.i.self_attn.{q,k}_norm.weight
    model.layers.i.mlp.{gate,up}_proj.*       ->  layers.i.mlp.gate_up_proj    (rows stacked)
    model.layers.i.mlp.down_proj.*            ->  layers.i.mlp.down_proj
    model.layers.i.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight

A linear is named by its prefix: the loader reads ``prefix.weight`` (+ ``prefix.bias``) of a
float checkpoint, or the stored quantized tensors of a pre-quantized one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tandem.engine.models.arch import ModelArch


@dataclass(frozen=True, slots=True)
class LinearSlot:
    """One of our linear layers and the checkpoint linears it stacks, in row order."""

    module: str  # our module: layers.3.self_attn.qkv_proj
    parts: tuple[str, ...]  # checkpoint prefixes: model.layers.3.self_attn.q_proj, ...
    bias: bool  # each part carries ``.bias``


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """One of our parameters filled from one checkpoint tensor as it is."""

    param: str  # ours: layers.3.input_layernorm.weight
    name: str  # the checkpoint's: model.layers.3.input_layernorm.weight


@dataclass(frozen=True, slots=True)
class Group:
    """The weights of one part of the model: the top level, or one decoder layer."""

    linears: tuple[LinearSlot, ...]
    tensors: tuple[TensorSlot, ...]


@dataclass(frozen=True, slots=True)
class WeightPlan:
    """Every weight the model consumes, grouped so the loader can go layer by layer."""

    top: Group
    layers: tuple[Group, ...]

    def linears(self) -> list[LinearSlot]:
        """Every linear layer, the top level's first."""
        return [lin for g in (self.top, *self.layers) for lin in g.linears]

    def without(self, modules: set[str]) -> WeightPlan:
        """This plan with the linears of ``modules`` left out (weights held elsewhere)."""
        def keep(g: Group) -> Group:
            return Group(tuple(lin for lin in g.linears if lin.module not in modules),
                         g.tensors)
        return WeightPlan(keep(self.top), tuple(keep(g) for g in self.layers))

    def tensor_names(self) -> list[str]:
        """The names a float checkpoint of this model holds (a tied lm_head left out)."""
        names: list[str] = []
        for g in (self.top, *self.layers):
            for lin in g.linears:
                for part in lin.parts:
                    names += [part + ".weight"] + ([part + ".bias"] if lin.bias else [])
            names += [t.name for t in g.tensors]
        return names


def dense_plan(arch: ModelArch) -> WeightPlan:
    """The plan of the dense decoder (causal_lm.py) in Hugging Face's Llama naming."""
    head = () if arch.tie_word_embeddings else (LinearSlot("lm_head", ("lm_head",), False),)
    top = Group(head, (TensorSlot("embed_tokens.weight", "model.embed_tokens.weight"),
                       TensorSlot("norm.weight", "model.norm.weight")))
    return WeightPlan(top, tuple(_dense_layer(arch, i) for i in range(arch.num_layers)))


def _dense_layer(arch: ModelArch, i: int) -> Group:
    ours, p = f"layers.{i}.", f"model.layers.{i}."
    attn, mlp = p + "self_attn.", p + "mlp."
    linears = (
        LinearSlot(ours + "self_attn.qkv_proj", tuple(attn + f"{n}_proj" for n in "qkv"),
                   arch.qkv_bias),
        LinearSlot(ours + "self_attn.o_proj", (attn + "o_proj",), arch.o_bias),
        LinearSlot(ours + "mlp.gate_up_proj", (mlp + "gate_proj", mlp + "up_proj"),
                   arch.mlp_bias),
        LinearSlot(ours + "mlp.down_proj", (mlp + "down_proj",), arch.mlp_bias),
    )
    norms = ["input_layernorm", "post_attention_layernorm"]
    if arch.qk_norm:
        norms += ["self_attn.q_norm", "self_attn.k_norm"]
    tensors = tuple(TensorSlot(ours + n + ".weight", p + n + ".weight") for n in norms)
    return Group(linears, tensors)


# --- mixture of experts (tandem/engine/models/layers/moe.py) --------------------------------
#
#   checkpoint (under model.layers.i.<block>.)        ours (under layers.i.mlp.)
#   gate.weight                                   ->  gate.weight                  (router)
#   gate.e_score_correction_bias                  ->  gate.e_score_correction_bias (DeepSeek-V3)
#   experts.e.<gate>, experts.e.<up>              ->  experts.e.gate_up_proj       (rows stacked)
#   experts.e.<down>                              ->  experts.e.down_proj
#   <shared>.{gate,up}_proj, <shared>.down_proj   ->  shared_expert.gate_up_proj, .down_proj
#   <shared_gate>.weight                          ->  shared_expert_gate           (Qwen2-MoE)


@dataclass(frozen=True, slots=True)
class MoeNames:
    """How a family's checkpoints name the tensors of a MoE layer."""

    block: str  # the module under model.layers.i: "block_sparse_moe" (Mixtral), "mlp"
    expert: tuple[str, str, str]  # an expert's gate, up and down linears
    shared: str = ""  # the shared expert(s): "shared_expert" (Qwen2-MoE), "shared_experts"
    shared_gate: str = "shared_expert_gate"  # the shared expert's sigmoid gate (Qwen2-MoE)


MIXTRAL_NAMES = MoeNames("block_sparse_moe", ("w1", "w3", "w2"))
QWEN_MOE_NAMES = MoeNames("mlp", ("gate_proj", "up_proj", "down_proj"), "shared_expert")
DEEPSEEK_MOE_NAMES = MoeNames("mlp", ("gate_proj", "up_proj", "down_proj"), "shared_experts")


def moe_plan(names: MoeNames) -> Callable[[ModelArch], WeightPlan]:
    """The plan of a decoder whose sparse layers (``arch.moe``) carry a MoE block named as
    ``names`` says, the dense plan elsewhere (a ``FamilySpec.plan``)."""
    return lambda arch: with_moe(dense_plan(arch), arch, names)


def with_moe(plan: WeightPlan, arch: ModelArch, names: MoeNames) -> WeightPlan:
    """``plan`` with the dense MLP slots (``layers.i.mlp.*``) of each of ``arch.moe``'s
    sparse layers replaced by its MoE block's; ``plan`` unchanged for a dense arch."""
    if arch.moe is None:
        return plan
    layers = list(plan.layers)
    for i in arch.moe.sparse_layers:
        mlp = f"layers.{i}.mlp."
        linears, tensors = _moe_slots(arch, i, names)
        g = layers[i]
        layers[i] = Group(
            tuple(s for s in g.linears if not s.module.startswith(mlp)) + linears,
            tuple(s for s in g.tensors if not s.param.startswith(mlp)) + tensors)
    return WeightPlan(plan.top, tuple(layers))


def _moe_slots(arch: ModelArch, i: int, names: MoeNames,
               ) -> tuple[tuple[LinearSlot, ...], tuple[TensorSlot, ...]]:
    assert arch.moe is not None
    moe, ours, p = arch.moe, f"layers.{i}.mlp.", f"model.layers.{i}.{names.block}."
    gate, up, down = names.expert
    linears = []
    for e in range(moe.num_experts):
        expert = f"{p}experts.{e}."
        linears += [LinearSlot(f"{ours}experts.{e}.gate_up_proj", (expert + gate, expert + up),
                               False),
                    LinearSlot(f"{ours}experts.{e}.down_proj", (expert + down,), False)]
    tensors = [TensorSlot(ours + "gate.weight", p + "gate.weight")]
    if moe.routing == "deepseek_v3":
        tensors.append(TensorSlot(ours + "gate.e_score_correction_bias",
                                  p + "gate.e_score_correction_bias"))
    if moe.shared_intermediate_size:
        shared = p + names.shared + "."
        bias = arch.mlp_bias  # as the shared expert's (layers/moe.py)
        linears += [LinearSlot(ours + "shared_expert.gate_up_proj",
                               (shared + "gate_proj", shared + "up_proj"), bias),
                    LinearSlot(ours + "shared_expert.down_proj", (shared + "down_proj",), bias)]
    if moe.shared_expert_gate:
        tensors.append(TensorSlot(ours + "shared_expert_gate", p + names.shared_gate + ".weight"))
    return tuple(linears), tuple(tensors)


# -- multi-head latent attention (DeepSeek-V2/V3: mla_lm.py) ---------------------------------
def mla_plan(arch: ModelArch) -> WeightPlan:
    """The plan of the MLA decoder in transformers' DeepSeek naming: the dense plan with
    each layer's attention as MLA's projections (names kept as they are, none fused)."""
    dense = dense_plan(arch)
    return WeightPlan(dense.top, tuple(_mla_layer(arch, i, g) for i, g in enumerate(dense.layers)))


def _mla_layer(arch: ModelArch, i: int, dense: Group) -> Group:
    m = arch.mla
    assert m is not None
    ours, attn = f"layers.{i}.self_attn.", f"model.layers.{i}.self_attn."

    def linear(name: str, bias: bool) -> LinearSlot:
        return LinearSlot(ours + name, (attn + name,), bias)

    def norm(name: str) -> TensorSlot:
        return TensorSlot(ours + name + ".weight", attn + name + ".weight")

    q = ((linear("q_a_proj", m.latent_bias), linear("q_b_proj", False)) if m.q_lora_rank
         else (linear("q_proj", False),))
    linears = q + (linear("kv_a_proj_with_mqa", m.latent_bias), linear("kv_b_proj", False),
                   linear("o_proj", arch.o_bias))
    norms = ((norm("q_a_layernorm"),) if m.q_lora_rank else ()) + (norm("kv_a_layernorm"),)
    mlp = tuple(lin for lin in dense.linears if ".mlp." in lin.module)
    layer_norms = tuple(t for t in dense.tensors if ".self_attn." not in t.param)
    return Group(linears + mlp, norms + layer_norms)
