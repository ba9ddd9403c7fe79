"""What an engine runs, loaded: the model, its arch, its tokenizer and its context length.

    ModelConfig.model --resolve_model (tandem/engine/loader.py)--> checkpoint directory
                      --read_arch, load_model (tandem/engine/models/weights.py)--> CausalLM
                      --quantize_model (tandem/engine/quant)--> layers in the checkpoint's own format
                                                         (auto) or requantized
                      --stack_expert_weights (CUDA)--> float MoE experts stacked for Triton
                      --AutoTokenizer, when the checkpoint has one--> tokenizer
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.engine.config import ModelConfig
from tandem.engine.errors import ContextLengthError
from tandem.engine.loader import resolve_model
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.causal_lm import CausalLM
from tandem.engine.models.layers.moe_experts import stack_expert_weights
from tandem.engine.models.weights import load_model, read_arch
from tandem.engine.parallel.plan import RankShard
from tandem.engine.quant import QuantSummary, quantize_model, weight_bytes
from tandem.engine.quant.gguf_blocks import gguf_source
from tandem.engine.quant.prequantized import detect_format

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Checkpoint:
    """A loaded model and what the engine needs to know about it."""

    path: Path
    model: CausalLM
    arch: ModelArch
    tokenizer: Any  # PreTrainedTokenizerBase, or None for tokenizer-less (random test) ones
    max_model_len: int  # the context the engine serves: as asked, else context_limit(arch)
    weights: QuantSummary  # the format the weights are held in
    weight_bytes: int  # what they occupy
    # one rank of a tensor-parallel group: the slice the model holds (``arch`` stays the
    # whole model's; shard.local_arch gives the rank's)
    shard: RankShard | None = None


def load_checkpoint(
    mc: ModelConfig, dtype: torch.dtype, device: torch.device, progress: bool = True,
    native: bool = False, tp: tuple[int, int] | None = None, expert_parallel: bool = False,
) -> Checkpoint:
    """Resolve, load and quantize ``mc.model`` (``mc.quantization``; ``native``: into the
    native CPU kernels' layout); ``tp`` (world, rank): keep that rank's shard of a
    tensor-parallel group (tandem/engine/parallel), whole routed experts of a MoE model when
    ``expert_parallel`` (read alone: no other expert's tensors are loaded). Raises
    ModelLoadError (ContextLengthError for a ``max_model_len`` above :func:`context_limit`;
    TensorParallelError for a model that does not split over ``world``)."""
    path = resolve_model(mc.model, mc.cache_dir)
    hf_config, arch = read_arch(path)
    max_model_len = served_context(arch, mc.max_model_len)
    tokenizer = _load_tokenizer(path)
    packed = native and device.type == "cpu" and dtype == torch.float32
    # the native fused forward widens bf16 weights itself: no fp32 copies for torch's GEMMs
    # (the model runner makes them if that path refuses the model after all); an FP8
    # checkpoint stays e4m3 for the kernels when its format is kept (auto, fp8) on one rank,
    # in a model of any float dtype (the kernels take fp32 activations from all of them)
    native_cpu = native and device.type == "cpu"
    gguf = gguf_source(mc.model)
    if expert_parallel and (tp is None or arch.moe is None):  # as vLLM: nothing to place
        log.info("--enable-expert-parallel has no effect on %s", "one rank" if tp is None
                 else "a model without mixture-of-experts layers")
    shard, select = None, None
    if tp is not None:
        from tandem.engine.parallel import shard as sharding

        shard = sharding.rank_shard(arch, *tp, group=tp_group(mc, gguf, path),
                                    expert_parallel=expert_parallel)
    experts = None if shard is None or shard.experts is None else range(shard.experts.start,
                                                                        shard.experts.stop)
    model, arch = load_model(path, dtype, device, max_model_len, progress, (hf_config, arch),
                             fp32_shadows=not native_cpu,
                             native_layout=(native_cpu and tp is None
                                            and mc.quantization in ("auto", "fp8")),
                             experts=experts)
    if shard is not None:
        cuts = sharding.shard_model(model, shard)
        select = functools.partial(sharding.shard_blocks, cuts=cuts)
    weights = quantize_model(model, mc.quantization, gguf, packed, select)
    if tp is not None:
        sharding.reduce_row_parallel(model)
    if device.type == "cuda" and stack_expert_weights(model):
        torch.cuda.empty_cache()  # the per-expert tensors the stacks replaced
    held = weight_bytes(model)
    log.info("loaded %s: weights %s, %.1f MiB", mc.model, weights.format, held / 2**20)
    if progress:
        print(f"[tandem] {mc.model}: weights {weights.format} ({held / 2**20:.0f} MiB)",
              flush=True)
    return Checkpoint(path, model, arch, tokenizer, max_model_len, weights, held, shard)


def tp_group(mc: ModelConfig, gguf: Path | None, path: Path) -> int | None:
    """The quantization group a tensor-parallel split of ``mc`` (checkpoint directory
    ``path``) must fall on, None when any column will do: 32 when the weights end up
    block-quantized here (a GGUF's blocks, int4 groups), the checkpoint's own group when it
    is stored pre-quantized (AWQ, GPTQ, compressed-tensors int4: whole groups per rank)."""
    from tandem.engine.parallel.shard import GGUF_GROUP

    if mc.quantization in ("int4", "int8") or (mc.quantization == "auto" and
                                               gguf is not None):
        return GGUF_GROUP
    return detect_format(path).split_group


def context_limit(arch: ModelArch) -> tuple[int, str]:
    """The longest context the engine computes exactly for ``arch``, and what sets it.

    Sliding-window layers attend through their window (tandem/engine/models/windows.py), so
    every family's limit is its ``max_position_embeddings``."""
    return arch.max_position_embeddings, "max_position_embeddings"


def served_context(arch: ModelArch, asked: int | None) -> int:
    """``asked`` (None: the model's limit); ContextLengthError when above the limit."""
    limit, why = context_limit(arch)
    if asked is not None and asked > limit:
        raise ContextLengthError(asked, limit, why)
    return limit if asked is None else asked


def _load_tokenizer(path: Path) -> Any:  # -> PreTrainedTokenizerBase | None
    """The checkpoint's tokenizer, or None for tokenizer-less (random test) checkpoints."""
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
