"""``tandem plan``: how many prefill and decode workers a workload needs, and whether
disaggregation is worth it for it at all.

    tandem plan --profile smollm2-cpu2.json --decode-profile smollm2-cpu1.json \\
        --workload mixed --rate 0.3 --slo-ttft 4 --slo-tpot 0.25
    tandem plan --device H200 --model Llama-3.1-8B --workload mixed --scale 4 \\
        --rate 200 --slo-ttft 2 --slo-tpot 0.05 --out plan/
    tandem plan --profile smollm2-cpu2.json --workload mixed --rate 0.3 \\
        --link-gbps 1 --link-rtt-ms 0.5

Profiles come from ``tandem profile`` (measured here) or, with ``--device``, from the
device's datasheet (tandem/planner/roofline.py: estimates). The workload is one of the benchmark's
mixes (lengths x ``--scale``) with Poisson, bursty (MMPP) or diurnal arrivals, or a recorded
trace (``--trace FILE.jsonl``, tandem/planner/trace.py). The search (tandem/planner/search.py) simulates
every configuration it weighs with the router's own placement code; it prints the cheapest
disaggregated split and the cheapest colocated pool that meet the SLO, their goodput, and the
flags and Helm values that deploy the winner. ``--out DIR`` writes plan.json, plan.png
(attainment vs rate) and values.yaml.

``--link-gbps``/``--link-rtt-ms`` put the KV handoff between prefill and decode workers on
that link (instead of the profile's ``transfer``): the simulator pushes at it, adaptive
placement prices each push at it, and the plan says when disaggregation stops paying on it:
the prompt length below which the router keeps a prompt on its decode worker (colocated),
and the link speed below which the workload's long prompts stay there too
(tandem/planner/link_report.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tandem.common.arg_parser import ArgParser


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="tandem plan", description=__doc__, config_file=True,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("profiles (measured, or a datasheet roofline)")
    g.add_argument("--profile", type=Path, help="a `tandem profile` JSON (every role)")
    g.add_argument("--decode-profile", type=Path, help="decode workers' profile (default: --profile)")
    g.add_argument("--colocated-profile", type=Path,
                   help="colocated workers' profile (default: --profile)")
    g.add_argument("--device", help="roofline from the datasheet: H100-SXM, H200, L40S, ...")
    g.add_argument("--model", help="with --device: Llama-3.1-8B, ... or a HF config.json path")
    g.add_argument("--gpus-per-worker", type=int, default=0,
                   help="with --device: tensor-parallel GPUs per worker (0: the fewest that fit)")
    g.add_argument("--weight-dtype", default="bf16", choices=["bf16", "fp8", "int4"])
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="mixed", help="mixed, chat, rag or multiturn")
    w.add_argument("--trace", type=Path, help="a recorded trace (JSON lines) instead")
    w.add_argument("--rate", type=float, default=None,
                   help="target requests/s (multiturn: conversations/s; a trace: rescaled)")
    w.add_argument("--arrivals", default="poisson", choices=["poisson", "mmpp", "diurnal"])
    w.add_argument("--scale", type=float, default=1.0, help="multiply every length")
    w.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    w.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("targets")
    s.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT target (s)")
    s.add_argument("--slo-tpot", type=float, default=0.1, help="TPOT target (s)")
    s.add_argument("--attainment", type=float, default=0.9,
                   help="share of requests inside both targets")
    s.add_argument("--placement", default="adaptive", choices=["adaptive", "remote"])
    k = p.add_argument_group("link between prefill and decode workers (default: the profile's)")
    k.add_argument("--link-gbps", type=float, default=None, help="bandwidth, Gb/s")
    k.add_argument("--link-rtt-ms", type=float, default=None,
                   help="fixed cost of a push (a round trip), ms (default 0.5 with --link-gbps)")
    p.add_argument("--trim-steps", type=int, default=0,
                   help="large plans: bisection steps trimming the scaled-up winner on the "
                        "whole trace (each a whole-trace simulation; 0: keep the cell's)")
    p.add_argument("--out", type=Path, default=None, help="write plan.json/.png, values.yaml")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _profiles(args: argparse.Namespace):
    from tandem.planner.devices import get_device
    from tandem.planner.models import from_hf_config, get_model
    from tandem.planner.profile import Profile
    from tandem.planner.roofline import fewest_gpus_per_worker, roofline_profile

    if args.device:
        if not args.model:
            raise ValueError("--device needs --model")
        path = Path(args.model)
        model = (from_hf_config(json.loads(path.read_text()), path.parent.name)
                 if path.suffix == ".json" else get_model(args.model))
        device = get_device(args.device)
        gpus = args.gpus_per_worker or fewest_gpus_per_worker(
            model, device, weight_dtype=args.weight_dtype)
        if gpus is None:
            raise ValueError(f"{model.name} does not fit one {device.name} server")
        profile = roofline_profile(model, device, gpus_per_worker=gpus,
                                   weight_dtype=args.weight_dtype)
        return profile, profile, profile
    if args.profile is None:
        raise ValueError("give --profile FILE (from `tandem profile`) or --device and --model")
    prefill = Profile.load(args.profile)
    decode = Profile.load(args.decode_profile) if args.decode_profile else prefill
    colocated = Profile.load(args.colocated_profile) if args.colocated_profile else prefill
    return prefill, decode, colocated


def _trace(args: argparse.Namespace):
    from tandem.common.request_shapes import scaled
    from tandem.planner import workload
    from tandem.planner.trace import read_jsonl

    if args.trace is not None:
        trace = read_jsonl(args.trace)
        return workload.rescale(trace, args.rate) if args.rate else trace
    if args.rate is None or args.rate <= 0:
        raise ValueError("--rate must be > 0")
    if args.workload == "multiturn":
        shape = workload.CHAT_SHAPE
        return workload.multiturn(args.rate, args.duration, shape, seed=args.seed)
    if args.workload not in workload.MIXES:
        raise ValueError(f"--workload must be one of {[*workload.MIXES, 'multiturn']}")
    mix = workload.MIXES[args.workload]
    if args.scale != 1.0:
        mix = workload.LengthMix(mix.name, tuple((scaled(k, args.scale), share)
                                                 for k, share in mix.kinds))
    if args.arrivals == "mmpp":  # half the time at 0.5x, half at 1.5x: args.rate on average
        return workload.mmpp((args.rate * 0.5, args.rate * 1.5), (30.0, 30.0), args.duration,
                             mix, seed=args.seed)
    if args.arrivals == "diurnal":
        return workload.diurnal(args.rate, 4.0, args.duration, args.duration, mix,
                                seed=args.seed)
    return workload.poisson(args.rate, args.duration, mix, seed=args.seed)


def _link(args: argparse.Namespace):
    """The link flags as a LinkPrior (None: the profile's transfer stands)."""
    from tandem.placement.link import LinkPrior

    if args.link_gbps is None:
        if args.link_rtt_ms is not None:
            raise ValueError("--link-rtt-ms needs --link-gbps")
        return None
    rtt_ms = 0.5 if args.link_rtt_ms is None else args.link_rtt_ms
    return LinkPrior(args.link_gbps, rtt_ms / 1000.0)


def main(argv: Sequence[str] | None = None) -> int:
    """Plan, print, and write ``--out``; 2 on bad inputs."""
    from tandem.placement.slo import Slo
    from tandem.planner.decision import decide
    from tandem.planner.link_report import link_report, with_link
    from tandem.planner.plot import plot_plan
    from tandem.planner.profile import ProfileError
    from tandem.planner.report import helm_values, table, to_json, up_flags
    from tandem.planner.search import PlanInputs, plan
    from tandem.planner.trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not (0 < args.attainment <= 1) or args.slo_ttft <= 0 or args.slo_tpot <= 0:
        parser.error("targets must be > 0 and --attainment in (0, 1]")
    try:
        prefill, decode, colocated = _profiles(args)
        trace = _trace(args)
        link = _link(args)
        if link is not None:
            prefill = with_link(prefill, link)
    except (ValueError, KeyError, OSError, ProfileError, TraceError) as err:
        print(f"tandem plan: {err}", file=sys.stderr)
        return 2
    if not trace:
        print("tandem plan: the workload has no requests", file=sys.stderr)
        return 2
    slo = Slo(args.slo_ttft, args.slo_tpot)
    say = (lambda _: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"planning {len(trace)} requests over {trace[-1].arrival_s:.0f} s; profiles: "
        f"prefill {prefill.model} on {prefill.device} ({prefill.source}), "
        f"decode {decode.device} ({decode.source})")
    inputs = PlanInputs(prefill, decode, colocated, trace, slo, args.attainment, args.placement)
    result = plan(inputs, say, trim_steps=max(args.trim_steps, 0))
    decision = decide(result)  # everything below deploys this one configuration
    winner = decision.chosen
    print(table(result, decision))
    print()
    print(decision.reason)
    if winner is not None:
        print("\ndeploy:\n  " + up_flags(winner, prefill, decode, slo))
        values = helm_values(winner, prefill, decode, slo)
        print("\nHelm values:\n" + "".join(f"  {line}\n" for line in values.splitlines()))
    link_summary = None
    if link is not None:
        prompts = sorted(r.prompt_tokens for r in trace)
        p90 = prompts[min(len(prompts) - 1, int(0.9 * len(prompts)))]
        text, verdicts = link_report(prefill, decode, slo, link, p90, prompts[-1])
        print("\n" + text)
        link_summary = {"gbps": link.gbps, "rtt_s": link.rtt_s, "p90_prompt_tokens": p90,
                        "verdicts": [{"decode_rows": v.rows,
                                      "shortest_remote_tokens": v.shortest_remote,
                                      "slowest_remote_gbps": v.slowest_gbps}
                                     for v in verdicts]}
    print(f"({result.simulations} simulations in {result.wall_s:.1f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        summary = {"profiles": {"prefill": prefill.to_json(), "decode": decode.to_json(),
                                "colocated": colocated.to_json()},
                   "workload": args.workload if args.trace is None else str(args.trace),
                   "requests": len(trace), "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
                   "attainment": args.attainment, "link": link_summary}
        for profile in summary["profiles"].values():
            profile.pop("samples", None)  # raw timings stay in the profile files
        (args.out / "plan.json").write_text(json.dumps(to_json(result, decision, summary),
                                                         indent=2))
        plot_plan(result, args.out / "plan.png", args.attainment, chosen=winner)
        if winner is not None:
            (args.out / "values.yaml").write_text(values)
        print(f"wrote {args.out}/plan.json, plan.png" + (", values.yaml" if winner else ""))
    return 0
