"""Command-line flags for an engine, shared by every process that hosts one.

``add_engine_args`` adds flags that mirror ``EngineConfig``'s fields; ``engine_config_from_args``
builds the validated config back from the parsed namespace. A launcher (``tandem local``,
``tandem up``) takes the same flags with ``add_forwarded_engine_args`` and hands what was given
to its workers with ``forwarded_engine_argv``.

vLLM's spellings of the same settings are taken too: ``--speculative-config`` (its JSON form,
mapped onto ``--speculative``/``--num-speculative-tokens``/``--ngram-max``/``--ngram-min``/
``--draft-model``: :func:`speculative_fields`), ``--enforce-eager`` (``--no-cuda-graphs``), and
``--trust-remote-code`` is refused by name: no code shipped with a checkpoint ever runs here.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection
from typing import Any

from tandem.common.arg_parser import refused
from tandem.engine.config import (
    GRAMMAR_COMPILE_BUDGET_S,
    KV_CACHE_DTYPES,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from tandem.engine.lora.config import LoraConfig, parse_module
from tandem.engine.spec.config import SPEC_METHODS, SpeculativeConfig


def _kv_cache_dtype(value: str) -> str:
    """--kv-cache-dtype's value: one of ``KV_CACHE_DTYPES``; vLLM's ``fp8_e5m2`` refused by
    name (the fp8 cache stores e4m3)."""
    if value == "fp8_e5m2":
        raise argparse.ArgumentTypeError(
            "fp8_e5m2 is not supported: the fp8 KV cache stores e4m3 (fp8 or fp8_e4m3)")
    if value not in KV_CACHE_DTYPES:
        raise argparse.ArgumentTypeError(
            f"invalid choice {value!r} (choose from {', '.join(KV_CACHE_DTYPES)})")
    return value


def _engine_flags() -> list[tuple[str, dict[str, Any]]]:
    """Every engine flag with its argparse keywords: the one definition ``add_engine_args``
    and launchers that forward engine flags (``tandem local``/``tandem up``) both use."""
    cache, sched = CacheConfig(), SchedulerConfig()  # slots classes: defaults live on instances
    spec, lora = SpeculativeConfig(), LoraConfig()
    return [
        ("--model", dict(default="smollm2", help="alias, HF directory or .gguf file")),
        ("--dtype", dict(default="auto", choices=["auto", "float32", "bfloat16", "float16"])),
        ("--device", dict(default="cpu", help="cpu, cuda or cuda:N")),
        ("--threads", dict(type=int, default=None, help="CPU threads for this engine")),
        ("--max-model-len", dict(type=int, default=None)),
        ("--seed", dict(type=int, default=0)),
        ("--block-size", dict(type=int, default=cache.block_size)),
        ("--num-blocks", dict(type=int, default=None, help="KV blocks (overrides memory)")),
        ("--kv-cache-memory-gb", dict(type=float, default=cache.kv_cache_memory_gb)),
        ("--gpu-memory-utilization", dict(
            type=float, default=None,
            help="CUDA: the share of the device (0-1] for weights, activations and the KV "
                 "cache, which gets what is left (vLLM's flag; default: "
                 "--kv-cache-memory-gb)")),
        ("--no-prefix-caching", dict(action="store_true")),
        ("--quantization", dict(
            default="auto", choices=["auto", "none", "int8", "int4", "fp8"],
            help="weights: auto keeps the checkpoint's own format (a GGUF's Q4_0/Q4_1/Q8_0 "
                 "blocks as stored), none dequantizes, int8/int4 requantize; fp8 loads a "
                 "checkpoint stored in FP8 (quant_method fp8, per-tensor or block-wise "
                 "scales), kept in e4m3 for the native CPU kernels (any --dtype) and "
                 "dequantized at load elsewhere, and refuses any other")),
        ("--kv-cache-dtype", dict(
            default="auto", type=_kv_cache_dtype, metavar="{" + ",".join(KV_CACHE_DTYPES) + "}",
            help="KV cache storage: auto is float16 for a float32 model on the CPU's native "
                 "path and the model dtype elsewhere; int8 keeps a scale per head vector; "
                 "fp8 (= fp8_e4m3) stores e4m3 over one scale for K and one for V, half a "
                 "16-bit cache's bytes (on the CPU the native forward reads it in its "
                 "kernels); fp8_e5m2 is refused")),
        ("--max-num-seqs", dict(type=int, default=sched.max_num_seqs)),
        ("--max-num-batched-tokens", dict(type=int, default=sched.max_num_batched_tokens)),
        ("--tensor-parallel-size", dict(
            type=int, default=1, metavar="N",
            help="split the model over N rank processes (vLLM's flag): attention heads and "
                 "MLP columns divide over them, KV heads divide or are replicated; on the "
                 "CPU over gloo")),
        ("--enable-expert-parallel", dict(
            action="store_true",
            help="with --tensor-parallel-size N, each rank holds whole routed experts of a "
                 "mixture-of-experts model (E/N each, contiguous) instead of every expert's "
                 "1/N slice (vLLM's flag); a no-op on a dense model or one rank")),
        ("--attention-backend", dict(default="auto", choices=["auto", "torch", "triton"])),
        ("--no-cuda-graphs", dict(action="store_true")),
        ("--enforce-eager", dict(action="store_true",
                                 help="vLLM's name for --no-cuda-graphs: every step eager")),
        ("--no-native-kernels", dict(action="store_true",
                                     help="CPU: run steps on torch ops (no fused native forward)")),
        ("--speculative", dict(
            default="none", choices=list(SPEC_METHODS),
            help="speculative decoding proposer (per-request opt-out: speculative=False)")),
        ("--num-speculative-tokens", dict(type=int, default=spec.num_speculative_tokens)),
        ("--ngram-max", dict(type=int, default=spec.ngram_max)),
        ("--ngram-min", dict(type=int, default=spec.ngram_min)),
        ("--draft-model", dict(default=None, help="draft checkpoint (same tokenizer)")),
        ("--draft-layers", dict(type=int, default=0,
                                help="draft = the target's first N layers (when no "
                                     "--draft-model)")),
        ("--speculative-config", dict(
            type=speculative_config, default=None, metavar="JSON",
            help="vLLM's JSON form: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2} or {\"model\": DRAFT, "
                 "\"num_speculative_tokens\": N} (method draft_model); other methods (eagle, "
                 "medusa, mtp, ...) are refused by name")),
        ("--trust-remote-code", dict(
            action=refused(TRUST_REMOTE_CODE), default=None,
            help="refused: architectures are built in, a checkpoint's code never runs")),
        ("--enable-lora", dict(action="store_true",
                               help="serve LoRA adapters (named as the request's model)")),
        ("--lora-modules", dict(
            type=lora_module, nargs="+", action="extend", default=None, metavar="NAME=PATH",
            help="PEFT adapter directories (adapter_config.json + "
                 "adapter_model.safetensors) to serve from the start")),
        ("--max-loras", dict(type=int, default=lora.max_loras,
                             help="distinct LoRA adapters one step may carry")),
        ("--max-lora-rank", dict(type=int, default=lora.max_lora_rank,
                                 help="the largest adapter rank accepted")),
        ("--max-cpu-loras", dict(type=int, default=None,
                                 help="adapters held in memory at once (default: no bound)")),
        ("--allow-runtime-lora-updates", dict(
            action="store_true",
            help="let the router's admin API load and unload adapters while serving (vLLM's "
                 "VLLM_ALLOW_RUNTIME_LORA_UPDATING)")),
        ("--grammar-compile-budget-s", dict(
            type=float, default=GRAMMAR_COMPILE_BUDGET_S,
            help="CPU seconds one structured-output grammar may take to compile; past it the "
                 "request is refused (400) and so is every repeat of that grammar")),
        ("--grammar-compile-wait-s", dict(
            type=float, default=None,
            help="seconds a request waits for its grammar's compile before it is answered "
                 "'busy' (RESOURCE_EXHAUSTED; default: the budget plus 1; keep it under the "
                 "router's --rpc-timeout-s)")),
    ]


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--model``, ``--dtype``, ``--threads``, cache and scheduler flags."""
    g = parser.add_argument_group("engine")
    for flag, kwargs in _engine_flags():
        g.add_argument(flag, **kwargs)
    return parser


def add_forwarded_engine_args(
    parser: argparse.ArgumentParser, *, skip: Collection[str] = (),
) -> argparse.ArgumentParser:
    """Add the engine flags (but those in ``skip``) to a launcher that passes them on to its
    workers: same names, types and choices, every default None (a flag not given is not
    forwarded, and the worker keeps its own default). Their values land under their own
    names (``_forward_dest``), so a launcher's flag of the same name (its ``--model``) stays
    apart; ``forwarded_engine_argv`` reads them."""
    g = parser.add_argument_group("engine (passed to every worker; default: the worker's)")
    for flag, kwargs in _engine_flags():
        if flag in skip:
            continue
        kwargs = {**kwargs, "default": None, "dest": _forward_dest(flag)}
        if "choices" not in kwargs and "action" not in kwargs:
            kwargs.setdefault("metavar", flag[2:].upper().replace("-", "_"))  # as add_engine_args
        g.add_argument(flag, **kwargs)
    return parser


def forwarded_engine_argv(
    args: argparse.Namespace, *, only: Collection[str] | None = None,
) -> list[str]:
    """The engine flags ``args`` sets (added by ``add_forwarded_engine_args``) as a worker's
    argv, ``--flag=value`` each; ``only`` keeps just those flags."""
    out: list[str] = []
    for flag, kwargs in _engine_flags():
        value = getattr(args, _forward_dest(flag), None)
        if value is None or (only is not None and flag not in only):
            continue
        if kwargs.get("action") == "store_true":
            out += [flag] if value else []
        elif flag == "--lora-modules":  # (name, path) pairs, given back as name=path
            out += [flag, *(f"{name}={path}" for name, path in value)]
        else:
            out.append(f"{flag}={value}")
    return out


def _forward_dest(flag: str) -> str:
    return "engine_" + flag[2:].replace("-", "_")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The validated EngineConfig for parsed flags (raises ValueError on bad values)."""
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            num_threads=args.threads,
            max_model_len=args.max_model_len,
            seed=args.seed,
            quantization=args.quantization,
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=not args.no_prefix_caching,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        speculative=_speculative(args),
        attention_backend=args.attention_backend,
        use_cuda_graphs=not (args.no_cuda_graphs or args.enforce_eager),
        use_native_kernels=not args.no_native_kernels,
        grammar_compile_budget_s=args.grammar_compile_budget_s,
        grammar_compile_wait_s=args.grammar_compile_wait_s,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        lora=LoraConfig(enabled=args.enable_lora, modules=tuple(args.lora_modules or ()),
                        max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                        max_cpu_loras=args.max_cpu_loras,
                        runtime_updates=args.allow_runtime_lora_updates),
    )


def lora_module(text: str) -> tuple[str, str]:
    """argparse type of one ``--lora-modules`` value: ``name=path`` or vLLM's JSON form."""
    try:
        return parse_module(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _speculative(args: argparse.Namespace) -> SpeculativeConfig:
    """The flags' SpeculativeConfig: ``--speculative-config`` (when given) over the others."""
    fields: dict[str, Any] = dict(
        speculative_method=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        draft_model=args.draft_model,
        draft_layers=args.draft_layers,
    )
    if args.speculative_config:
        if args.speculative != "none":
            raise ValueError("--speculative-config and --speculative both name a proposer: "
                             "give one")
        fields.update(speculative_fields(args.speculative_config))
    return SpeculativeConfig(**fields)


TRUST_REMOTE_CODE = (
    "refused: Tandem never runs code shipped with a checkpoint; the architectures it serves "
    "are built in (tandem/engine/models) and a checkpoint of another one is refused by name. "
    "Leave the flag out")

# vLLM's speculative_config keys this engine honours -> SpeculativeConfig's fields.
_SPEC_KEYS = {"num_speculative_tokens": "num_speculative_tokens",
              "prompt_lookup_max": "ngram_max", "prompt_lookup_min": "ngram_min",
              "model": "draft_model"}
# vLLM's method names -> ours (a draft checkpoint is vLLM's "draft_model").
_SPEC_METHODS = {"ngram": "ngram", "draft_model": "draft"}


def speculative_config(text: str) -> str:
    """``--speculative-config``'s argparse type: the JSON checked (:func:`speculative_fields`
    raises argparse's error, naming what is wrong) and passed on as given."""
    try:
        speculative_fields(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def speculative_fields(text: str) -> dict[str, Any]:
    """SpeculativeConfig's fields for vLLM's ``--speculative-config`` JSON; ValueError naming
    the key or method this engine does not have.

        {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": MAX,
         "prompt_lookup_min": MIN}            -> --speculative ngram (a bound left out keeps
                                                 ours, moved to stay MIN <= MAX)
        {"model": DRAFT, "num_speculative_tokens": K} (method "draft_model" or left out)
                                              -> --speculative draft --draft-model DRAFT
    """
    try:
        spec = json.loads(text)
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(spec, dict):
        raise ValueError("must be a JSON object, e.g. {\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 4}")
    spec = dict(spec)
    if spec.get("draft_tensor_parallel_size", 1) == 1:  # the only layout a draft has here
        spec.pop("draft_tensor_parallel_size", None)
    method = spec.pop("method", None)
    if method is None:
        method = "draft_model" if spec.get("model") else None
    if method is None:
        raise ValueError("needs \"method\" (ngram or draft_model) or \"model\" (a draft "
                         "checkpoint)")
    if method not in _SPEC_METHODS:
        raise ValueError(f"speculative method {method!r} is not available here: "
                         f"{' and '.join(sorted(_SPEC_METHODS))} are (no EAGLE, Medusa, MTP "
                         "or other trained heads)")
    unknown = sorted(set(spec) - set(_SPEC_KEYS))
    if unknown:
        raise ValueError(f"not supported: {', '.join(unknown)} (keys: method, "
                         f"{', '.join(_SPEC_KEYS)})")
    out: dict[str, Any] = {"speculative_method": _SPEC_METHODS[method]}
    for key, value in spec.items():
        kind = str if key == "model" else int
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{key} must be {'a string' if kind is str else 'an integer'}")
        out[_SPEC_KEYS[key]] = value
    if out["speculative_method"] == "draft" and not out.get("draft_model"):
        raise ValueError("method draft_model needs \"model\": the draft checkpoint")
    if out["speculative_method"] == "ngram" and "draft_model" in out:
        raise ValueError("method ngram takes no \"model\"")
    defaults = SpeculativeConfig()
    if "ngram_min" in out and "ngram_max" not in out:
        out["ngram_max"] = max(out["ngram_min"], defaults.ngram_max)
    if "ngram_max" in out and "ngram_min" not in out:
        out["ngram_min"] = min(out["ngram_max"], defaults.ngram_min)
    try:  # the same checks a worker makes (k >= 1, 1 <= min <= max)
        SpeculativeConfig(**{k: v for k, v in out.items() if k != "draft_model"},
                          draft_layers=1 if "draft_model" in out else 0)
    except ValueError as err:
        raise ValueError(str(err)) from None
    return out
