"""Decode step time of a mixture-of-experts model against dense models of the same attention:
one with the MoE's *active* feed-forward (top_k x expert width) and one with all of it.

    python -m bench.engine.moe_vs_dense [--rows 1,4,16,64] [--hidden 768] [--expert-width 1024]
                                        [--experts 8] [--top-k 2] [--layers 4] [--repeats 5]
                                        [--threads 2] [--dtype float32|bfloat16]
                                        [--paths native,torch] [--many-experts]

Three random checkpoints (tandem/engine/testing/tiny.py), written to a temporary folder:
Mixtral with ``--experts`` experts of ``--expert-width``, ``--top-k`` per token; Mistral (the
same attention, no experts) with an MLP ``top_k x expert-width`` wide (the active dense: the
same active parameters, the router's ``experts x hidden`` aside); and Mistral with an MLP
``experts x expert-width`` wide (the total dense: every expert's parameters in one MLP). The
three are timed on each of ``--paths``: ``native`` (the fused native CPU forward,
tandem/engine/native: the MoE's experts in moe_experts.h) and ``torch`` (the torch forward,
tandem/engine/models/layers/moe_experts.py), over ``rows`` sequences of 256 cached tokens,
one decode row each; each figure is the fastest of ``--repeats`` steps, all models and paths
taking turns. Prints ms per step and MoE / active-dense, with the experts a step reads per
layer (counted on the torch forward's routers; each active expert's weights are read once,
whatever its rows): the MoE costs close to its active share where a step's rows reach few
experts, and moves towards the total dense as they spread over all of them.

``--many-experts`` is the many-small-experts shape of Qwen3-MoE and DeepSeek-V3 (128 experts
of width 256, top 8: ``--experts 128 --top-k 8 --expert-width 256``): a step's rows spread
over many more experts than Mixtral's top 2 of 8 (the total dense is then 16x the active).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.engine.native_rows import BLOCKS_PER_SEQ, _shape, _torch_step
from tandem.engine import LLM
from tandem.engine.models.layers import SparseMoE
from tandem.engine.testing import make_tiny_checkpoint


def _checkpoints(root: Path, a: argparse.Namespace) -> dict[str, Path]:
    shape = dict(hidden_size=a.hidden, num_layers=a.layers, num_heads=a.hidden // 64,
                 num_kv_heads=max(1, a.hidden // 256), vocab_size=4096)
    return {
        "moe": make_tiny_checkpoint(root / "moe", arch="mixtral", **shape,
                                    intermediate_size=a.expert_width,
                                    num_local_experts=a.experts, num_experts_per_tok=a.top_k),
        "active": make_tiny_checkpoint(root / "active", arch="mistral", **shape,
                                       intermediate_size=a.top_k * a.expert_width),
        "total": make_tiny_checkpoint(root / "total", arch="mistral", **shape,
                                      intermediate_size=a.experts * a.expert_width),
    }


def _interleaved_min(steps: dict[tuple[str, str], Callable[[], None]], repeats: int,
                     ) -> dict[tuple[str, str], float]:
    """Each step's fastest of ``repeats`` runs (after one warm-up), the models taking turns
    so that a busy machine slows them alike; the minimum is the run least disturbed."""
    best = {name: float("inf") for name in steps}
    for step in steps.values():  # warm-up
        step()
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _runners(keys: list[tuple[str, str]], checkpoints: dict[str, Path], blocks: int,
             dtype: str) -> dict[tuple[str, str], object]:
    """(path, model) -> that model's runner on that path, for each of ``keys``."""
    runners = {}
    for path, name in keys:
        runner = LLM(str(checkpoints[name]), progress=False, num_blocks=blocks, dtype=dtype,
                     use_native_kernels=path == "native").engine.runner
        if path == "native" and runner.fused is None:
            raise SystemExit(f"the fused native forward does not take the {name} model here")
        runners[path, name] = runner
    return runners


def _step_fn(path: str, runner, step: tuple) -> Callable[[], None]:
    """One decode step of ``runner`` on ``path`` (every row sampled, as a decode samples)."""
    if path == "native":
        return functools.partial(runner.fused, *step, runner.kv_cache, list(range(len(step[0]))))
    return functools.partial(_torch_step, runner, *step)


def _experts_read(runner, step: tuple) -> float:
    """The experts one step of ``runner``'s MoE model reads, per layer on average (each
    active expert's weights are read once, whatever its rows)."""
    counts: list[int] = []
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda _m, _i, out: counts.append(int(out[1].unique().numel())))
        for layer in runner.model.layers if isinstance(layer.mlp, SparseMoE)]
    _torch_step(runner, *step)
    for h in hooks:
        h.remove()
    return sum(counts) / len(counts)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,16,64")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--expert-width", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--paths", default="native,torch")
    ap.add_argument("--many-experts", action="store_true",
                    help="128 experts x 256 wide, top 8 (overrides the three flags above)")
    args = ap.parse_args()
    if args.many_experts:
        args.experts, args.top_k, args.expert_width = 128, 8, 256
    paths = args.paths.split(",")
    if not paths or set(paths) - {"native", "torch"}:
        raise SystemExit("--paths: native, torch or both")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    rows = [int(r) for r in args.rows.split(",")]
    blocks = max(rows) * BLOCKS_PER_SEQ + 8
    timed = [(path, name) for path in paths for name in ("moe", "active", "total")]
    with tempfile.TemporaryDirectory() as tmp:
        # the torch MoE runner counts the experts a step reads (its routers' choices)
        runners = _runners(timed + [("torch", "moe")] * ("torch" not in paths),
                           _checkpoints(Path(tmp), args), blocks, args.dtype)
    counter = runners["torch", "moe"]
    params = {name: sum(p.numel() for n, p in r.model.named_parameters() if "layers." in n)
              for (path, name), r in runners.items() if path == paths[0]}
    print(f"{args.layers} layers, hidden {args.hidden}, {args.experts} experts x "
          f"{args.expert_width} (top {args.top_k}); {args.dtype}, {args.threads} threads")
    print("decoder parameters: " + ", ".join(f"{n} {p / 1e6:.1f}M" for n, p in params.items()))
    print(f"{'path':>6} {'rows':>5} {'experts read':>13} {'moe ms':>8} {'active ms':>10} "
          f"{'total ms':>9} {'moe/active':>11} {'moe/total':>10}")
    for n in rows:
        step = _shape(n, "decode", counter.block_size)
        secs = _interleaved_min({key: _step_fn(key[0], runners[key], step) for key in timed},
                                args.repeats)
        read = _experts_read(counter, step)
        for path in paths:
            ms = {name: secs[path, name] * 1e3 for name in ("moe", "active", "total")}
            print(f"{path:>6} {n:>5} {read:>6.2f} of {args.experts:<4} {ms['moe']:>8.2f} "
                  f"{ms['active']:>10.2f} {ms['total']:>9.2f} "
                  f"{ms['moe'] / ms['active']:>10.2f}x {ms['moe'] / ms['total']:>9.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
