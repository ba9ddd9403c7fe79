"""Profiles from datasheets: what a worker would cost on hardware this machine does not have.

ESTIMATES. A roofline profile is a first guess for sizing a fleet before anyone has run the
engine on the device; replace it with a measured profile (``tandem profile``) as soon as one
exists. It fills tandem/planner/profile.py's step model from peak figures derated by efficiency
factors, per GPU of a worker of n = ``gpus_per_worker`` tensor-parallel GPUs::

    base_s              = streamed weight bytes / n / (HBM B/s x mbu)        every step reads
                          + LAUNCH_OVERHEAD_S                                all weights once
                          + 2 x layers x tp_link.latency_s          (n > 1)
    per_prefill_token_s = 2 x prefill params / n / (FLOP/s x mfu)  + all-reduce bytes/token
    per_row_s           = 2 x decode params / n / (FLOP/s x decode_mfu) + all-reduce bytes/token
    per_context_token_s = KV bytes per token per GPU / (HBM B/s x mbu)      decode attention
                          reads each cached position's K and V (MLA: its latent row) once
                          per step
    per_prefill_pair_s  = 4 x layers x heads x head_dim / n / (FLOP/s x mfu)  prefill
                          attention: QK^T and PV, 2 FLOPs each per pair and head dim (MLA:
                          2 x layers x heads x (qk + v head dims), keys and values decompressed)
    kv_capacity_tokens  = (memory x memory_utilization - weights / n - activation reserve)
                          / KV bytes per token per GPU
    KV bytes per token  the engine's cache shape (tandem/common/kv_cache_shape.py): per GPU
                          its share of the KV heads (a whole head at least), or MLA's whole
                          latent row, which every GPU's query heads read
    transfer            = n x kv_link B/s x LINK_EFFICIENCY, + HANDOFF_LATENCY_S per handoff

    streamed weights  all of them but the input embedding (a lookup reads only its rows)
    decode params     active params less the input embedding: 2 FLOPs per weight per token
    prefill params    decode params less the LM head: logits only for a prompt's last token
    all-reduce        Megatron tensor parallelism all-reduces the hidden state twice a layer
                      (after attention, after the MLP); a ring moves 2 (n-1)/n of the
                      message per GPU: 2 x layers x 2 (n-1)/n x hidden x 2 bytes per token,
                      at tp_link B/s x LINK_EFFICIENCY
    FLOP/s            dense BF16; dense FP8 for FP8 weights on a chip with FP8 tensor cores
                      (W8A8); INT4 weights (W4A16) and FP8 on A100 compute in BF16

Efficiency factors (the defaults; pass measured ones when known):

    PREFILL_MFU 0.5   model FLOPs utilization of prefill: large GEMMs reach 0.4-0.6 of the
                      dense peak in vLLM/SGLang-class engines
    DECODE_MBU  0.7   memory bandwidth utilization of decode: 0.6-0.8 of the HBM peak for
                      the weight and KV streams of a batched decode step
    DECODE_MFU  0.3   the per-row compute of decode: GEMMs with few rows (M = batch) tile
                      poorly on tensor cores, and each row adds sampling and bookkeeping
    LINK_EFFICIENCY 0.8  achievable fraction of a link's peak (NCCL bus bandwidth, RDMA)

Known biases, all pessimistic: a step's weight read and its compute are added, not
overlapped (a mixed step is overestimated by at most the smaller of the two); a mixture of
experts reads every expert each step (true once a batch has more than a few tokens; not at
batch 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.common.ffn_activations import moe_layer_bytes
from tandem.planner.devices import Device
from tandem.planner.models import ModelError, ModelShape
from tandem.planner.profile import Profile, ProfileError, StepCost, Transfer

PREFILL_MFU = 0.5
DECODE_MBU = 0.7
DECODE_MFU = 0.3
LINK_EFFICIENCY = 0.8
# Per step: kernel launches (decode under CUDA graphs), scheduling and sampling; vLLM-class
# engines spend 0.3-1 ms per step outside the kernels' memory and compute time.
LAUNCH_OVERHEAD_S = 0.5e-3
# Per KV handoff: the Reserve, Prefill and commit RPC round trips inside a datacenter.
HANDOFF_LATENCY_S = 1e-3
ACTIVATION_BYTES = 2  # BF16 hidden states and all-reduce messages
# Per GPU, outside the weights and KV: CUDA graphs, cuBLAS and NCCL workspaces.
FIXED_RESERVE_BYTES = 512 << 20
# Tensor parallelism stays inside one server (NVLink or PCIe): 8 GPUs at most.
MAX_GPUS_PER_WORKER = 8


def roofline_profile(
    model: ModelShape,
    device: Device,
    *,
    gpus_per_worker: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    mfu: float = PREFILL_MFU,
    mbu: float = DECODE_MBU,
    decode_mfu: float = DECODE_MFU,
    memory_utilization: float = 0.9,
    chunk_tokens: int = 2048,
    max_num_seqs: int = 256,
    block_size: int = 16,
) -> Profile:
    """An estimated profile of one ``gpus_per_worker``-GPU worker of ``model`` on ``device``.

    ProfileError when the weights (and a chunk's activations and KV) do not fit, or the
    model cannot be split ``gpus_per_worker`` ways. See the module docstring for the model.
    """
    n = gpus_per_worker
    for label, value in (("mfu", mfu), ("mbu", mbu), ("decode_mfu", decode_mfu),
                         ("memory_utilization", memory_utilization)):
        if not 0 < value <= 1:
            raise ProfileError(f"{label} must be in (0, 1], got {value}")
    if not _splittable(model, n):
        raise ProfileError(f"{model.name}: {model.heads} heads / {model.kv_heads} KV heads "
                           f"cannot be split across {n} GPUs")
    fit = _memory(model, device, n, weight_dtype, kv_dtype, memory_utilization, chunk_tokens,
                  max_num_seqs)
    if fit.capacity < chunk_tokens:
        fewest = fewest_gpus_per_worker(
            model, device, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
            memory_utilization=memory_utilization, chunk_tokens=chunk_tokens,
            max_num_seqs=max_num_seqs)
        hint = (f"no split up to {MAX_GPUS_PER_WORKER} GPUs fits" if fewest is None
                else f"gpus_per_worker={fewest} fits")
        raise ProfileError(
            f"{model.name} ({weight_dtype}) does not fit {n} x {device.name}: "
            f"{fit.weights / 1e9:.1f} GB of weights + {fit.reserve / 1e9:.1f} GB activations "
            f"per GPU of {fit.usable / 1e9:.1f} GB usable leave room for {fit.capacity} KV "
            f"tokens (< chunk_tokens={chunk_tokens}); {hint}")
    weight_bytes = model.weight_bytes(weight_dtype)
    kv_gpu_token = fit.kv_gpu_token

    hbm = device.hbm_bytes_per_s * mbu
    flops = device.bf16_flops
    if weight_dtype == "fp8" and device.fp8_flops is not None:
        flops = device.fp8_flops
    input_embedding = 0 if model.tie_embeddings else model.vocab * model.hidden
    streamed = weight_bytes - input_embedding * 2  # embedding stays BF16 (tandem/planner/models.py)
    decode_params = model.active_params - input_embedding
    prefill_params = decode_params - model.lm_head_params

    allreduce_fixed = 0.0
    allreduce_token = 0.0
    if n > 1:
        per_gpu_bytes = 2 * (n - 1) / n * model.hidden * ACTIVATION_BYTES
        link = device.tp_link.bytes_per_s * LINK_EFFICIENCY
        allreduce_fixed = 2 * model.layers * device.tp_link.latency_s
        allreduce_token = 2 * model.layers * per_gpu_bytes / link

    step = StepCost(
        base_s=streamed / n / hbm + LAUNCH_OVERHEAD_S + allreduce_fixed,
        per_row_s=2 * decode_params / n / (flops * decode_mfu) + allreduce_token,
        per_prefill_token_s=2 * prefill_params / n / (flops * mfu) + allreduce_token,
        per_context_token_s=kv_gpu_token / hbm,
        per_prefill_pair_s=model.attention_pair_flops / n / (flops * mfu),
    )
    transfer = Transfer(
        bandwidth_bytes_per_s=n * device.kv_link.bytes_per_s * LINK_EFFICIENCY,
        latency_s=HANDOFF_LATENCY_S + device.kv_link.latency_s,
    )
    return Profile(
        model=model.name,
        device=device.name,
        step=step,
        transfer=transfer,
        kv_bytes_per_token=model.kv_bytes_per_token(kv_dtype),
        kv_capacity_tokens=fit.capacity,
        chunk_tokens=chunk_tokens,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        gpus_per_worker=n,
        source="roofline",
        notes=(f"datasheet estimate (tandem/planner/roofline.py), replace with `tandem profile`: "
               f"weights {weight_dtype}, KV {kv_dtype}, TP={n}, mfu={mfu}, mbu={mbu}, "
               f"decode_mfu={decode_mfu}, kv link {device.kv_link.name}"),
        samples={"roofline": {
            "weight_bytes_per_gpu": fit.weights,
            "activation_reserve_bytes_per_gpu": fit.reserve,
            "usable_bytes_per_gpu": fit.usable,
            "kv_bytes_per_token_per_gpu": kv_gpu_token,
            "flops_per_gpu": flops,
            "hbm_bytes_per_s_per_gpu": device.hbm_bytes_per_s,
        }},
    )


def activation_reserve_bytes(model: ModelShape, gpus: int, chunk_tokens: int,
                             max_num_seqs: int) -> float:
    """Per-GPU memory a step needs besides weights and KV (a rough upper estimate).

    One layer's live activations for a full chunk (residual and normed hidden states, q/k/v
    and attention output ~ 4 x hidden; a dense MLP's gate, up and product ~ 3 x intermediate,
    split n ways; a mixture-of-experts layer as the engine's reserve counts it,
    tandem/common/ffn_activations.py: router scores, the (token, expert) slots' hidden-wide
    buffers, one expert's intermediate (split n ways) over the whole chunk, shared experts),
    FP32 logits for every decode row, and FIXED_RESERVE_BYTES.
    """
    per_token = (4 * model.hidden + 3 * model.intermediate / gpus) * ACTIVATION_BYTES
    if model.experts > 1:
        moe = moe_layer_bytes(model.hidden, model.experts, model.experts_per_token,
                              math.ceil(model.intermediate / gpus), ACTIVATION_BYTES,
                              shared_width=math.ceil(model.shared_intermediate / gpus),
                              fp32_router=True)  # the larger figure of the two routers
        dense = 3 * model.dense_intermediate / gpus * ACTIVATION_BYTES
        per_token = 4 * model.hidden * ACTIVATION_BYTES + max(moe, dense)
    logits = max_num_seqs * model.vocab / gpus * 4
    return chunk_tokens * per_token + logits + FIXED_RESERVE_BYTES


@dataclass(frozen=True, slots=True)
class _Memory:
    """One GPU's memory budget (bytes) and the KV tokens it leaves room for."""

    usable: float
    weights: float
    reserve: float
    kv_gpu_token: int
    capacity: int


def _splittable(model: ModelShape, n: int) -> bool:
    """Tensor parallelism splits the heads evenly; KV heads split or replicate evenly (MLA's
    one latent is whole on every GPU)."""
    if n < 1 or model.heads % n:
        return False
    return model.mla or not (model.kv_heads % n and n % model.kv_heads)


def _memory(model: ModelShape, device: Device, n: int, weight_dtype: str, kv_dtype: str,
            memory_utilization: float, chunk_tokens: int, max_num_seqs: int) -> _Memory:
    try:
        weights = model.weight_bytes(weight_dtype) / n
        # Each GPU holds its share of the KV heads, one whole head when n > kv_heads.
        kv_gpu_token = model.kv_bytes_per_token(kv_dtype, gpus=n)
    except ModelError as exc:
        raise ProfileError(str(exc)) from exc
    usable = device.memory_bytes * memory_utilization
    reserve = activation_reserve_bytes(model, n, chunk_tokens, max_num_seqs)
    free = usable - weights - reserve
    capacity = int(free // kv_gpu_token) if free > 0 else 0
    return _Memory(usable, weights, reserve, kv_gpu_token, capacity)


def fewest_gpus_per_worker(
    model: ModelShape,
    device: Device,
    *,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_utilization: float = 0.9,
    chunk_tokens: int = 2048,
    max_num_seqs: int = 256,
) -> int | None:
    """The smallest tensor-parallel split (<= MAX_GPUS_PER_WORKER) that
    :func:`roofline_profile` accepts with these arguments; None when none does."""
    for n in range(1, MAX_GPUS_PER_WORKER + 1):
        if _splittable(model, n) and _memory(model, device, n, weight_dtype, kv_dtype,
                                             memory_utilization, chunk_tokens,
                                             max_num_seqs).capacity >= chunk_tokens:
            return n
    return None
