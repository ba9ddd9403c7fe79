"""``tandem profile``: measure what a worker costs on this machine, for ``tandem plan``.

    tandem profile --model smollm2 --threads 2 --out smollm2-cpu2.json
    tandem profile --model smollm2 --threads 1 --out smollm2-cpu1.json --no-transfer
    tandem profile --model llama-70b --device cuda --tensor-parallel-size 4 --out 70b-tp4.json

Takes the workers' own engine flags (the same model, dtype, quantization, threads and chunk
budget make the same costs), times engine steps of known shape, fits the step-cost model of
tandem/planner/profile.py and writes it as JSON (tandem/profiler says what is measured).
With ``--tensor-parallel-size N`` it measures a worker of that group (N rank processes, as
``tandem decode --tensor-parallel-size N`` runs them): the profile counts N devices a worker
(``gpus_per_worker``) and one rank's KV bytes per token.
For hardware this machine lacks, ``tandem plan --device h100`` uses a datasheet roofline
instead (tandem/planner/roofline.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tandem.common.arg_parser import ArgParser


def build_parser() -> argparse.ArgumentParser:
    from tandem.engine.cli_args import add_engine_args

    p = ArgParser(prog="tandem profile", description=__doc__, config_file=True,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where to write the profile JSON")
    p.add_argument("--repeats", type=int, default=3, help="timings per step shape")
    p.add_argument("--quick", action="store_true", help="a few shapes only (smoke runs)")
    p.add_argument("--no-transfer", action="store_true",
                   help="skip the KV transport measurement (assumes 1 GB/s)")
    p.add_argument("--label", default="", help="model name in the profile (default: its dir)")
    add_engine_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, fit, write; 2 on bad flags or a model that does not load."""
    from tandem.engine.cli_args import engine_config_from_args
    from tandem.engine.errors import ModelLoadError
    from tandem.engine.llm_engine import LLMEngine
    from tandem.profiler.engine_profile import ProfileOptions, profile_engine

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    try:
        config = engine_config_from_args(args)
        engine = LLMEngine(config, progress=True)
    except (ValueError, ModelLoadError) as err:
        print(f"tandem profile: {err}", file=sys.stderr)
        return 2
    options = ProfileOptions(args.repeats, args.quick, not args.no_transfer)
    try:
        profile = profile_engine(engine, options, label=args.label or args.model,
                                 device=_device_name(config.model.device))
    finally:
        engine.close()  # a group's other ranks stop with it
    profile.save(args.out)
    print(f"wrote {args.out}")
    return 0


def _device_name(device: str) -> str:
    """A readable device name: the CPU model or the CUDA device's name."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "cpu"
