"""What bench/planner_validation takes from a sweep's kept step logs besides its profiles:
the host-sharing factors and the workers' profiles as serving ran them.

    sweep point's host_overlap ─┬─> host_sharing_of    the disaggregated workers' slowdown
    (bench/serving/step_overlap.py)     │                      beside each other (--host-sharing served)
                                ├─> served_profiles    the two disaggregated workers' profiles
                                │                      fitted to their steps alone
                                └─> colocated_served   the colocated worker's profile fitted to
                                                       its steps (--serving served)

A point's ``host_overlap`` (scripts/bench_serve) lays the decode worker's steps beside the
prefill worker's. A colocated setup has one worker, so every one of its steps is alone: its
points (where the sweep kept its step log) give its served fits and no host factor.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from bench.serving.step_overlap import (
    ServedFit,
    prefill_length_table,
    prefill_served_fit,
    served_fits,
    served_sharing,
)
from tandem.planner.profile import Profile
from tandem.planner.sim.host import HostSharing

Served = list[tuple[str, str, float, dict[str, Any]]]  # (setup, mix, rate, host_overlap)


def served_overlaps(sweep: dict[str, Any], setups: Collection[str]) -> Served:
    """(setup, mix, rate, host_overlap) of every point of ``setups`` in a sweep whose step
    logs were kept and laid side by side (scripts/bench_serve)."""
    return [(setup, pt["mix"], pt["rate"], pt["host_overlap"])
            for setup, points in sweep["summaries"].items() if setup in setups
            for pt in points.values() if "host_overlap" in pt]


def host_sharing_of(text: str | None, served: Served, prefill: Profile | None = None,
                    decode: Profile | None = None) -> HostSharing | None:
    """The ``--host-sharing`` value: None, parsed factors, or ``served``: pooled from the
    disaggregated points' step logs in ``served`` (ValueError when they have none to pool;
    the decode factors as ratios of means against ``decode``'s steps where the logs have
    them, bench/step_overlap.mean_factor); ``served-by-length``: the same with the prefill
    factor by prompt length (``prefill_length_table`` against ``prefill``'s steps as served
    alone; the single factor where the logs have too few shared steps)."""
    if text is None:
        return None
    if text not in ("served", "served-by-length"):
        return HostSharing.parse(text)
    points = [o for *_, o in served]
    pooled = served_sharing(points, decode.step if decode is not None else None)
    if pooled is None:
        raise ValueError(f"--host-sharing {text}: the sweep has no step-log factors "
                         "(scripts/bench_serve records them for the disaggregated setups)")
    if text == "served-by-length":
        if prefill is None:
            raise ValueError("--host-sharing served-by-length needs the prefill profile")
        table = prefill_length_table(points, prefill.step,
                                     prefill_served_fit(points, prefill.step))
        if table is not None:
            pooled = HostSharing(pooled.decode_slowdown, table)
    return pooled


def with_fit(profile: Profile, fit: ServedFit | None, prompt: ServedFit | None = None
             ) -> Profile:
    """``profile`` with its step costs times ``fit.scale`` and ``fit.overhead_s`` as its
    ``serving_step_s``, and ``prompt.scale`` as its ``serving_prompt_scale``; unchanged
    where a fit is None."""
    if fit is not None:
        profile = replace(profile, step=profile.step.scaled(fit.scale),
                          serving_step_s=fit.overhead_s)
    if prompt is not None:
        profile = replace(profile, serving_prompt_scale=prompt.scale)
    return profile


def served_profiles(served: Served, prefill: Profile, decode: Profile
                    ) -> tuple[Profile, Profile, dict[str, ServedFit | None]]:
    """``--serving served`` for the disaggregated setups: (prefill, decode) with each
    worker's steps as its served steps alone ran against the profile
    (bench/step_overlap.served_fits: step costs x scale, plus the overhead as
    ``serving_step_s``; the decode worker's prompt steps their own scale), and the fits. A
    worker without a fit keeps its profile; ValueError when neither has one."""
    fits = served_fits([o for *_, o in served], decode.step, prefill.step)
    if not any(fits.values()):
        raise ValueError("--serving served: the sweep's step logs have no steps alone with "
                         "their shapes (scripts/bench_serve records them)")
    return (with_fit(prefill, fits["prefill"]),
            with_fit(decode, fits["decode"], fits["prompt"]), fits)


def colocated_served(served: Served, profile: Profile
                     ) -> tuple[Profile, dict[str, ServedFit | None]]:
    """``--serving served`` for the colocated setup: ``profile`` (the two-thread one its
    worker runs on) fitted as the disaggregated decode worker's is, from the colocated
    points' steps (all alone): its decode steps' scale and overhead, its prompt steps' own
    scale on top; and the fits as ``colocated`` and ``colocated_prompt``.

    Measured on a 2-core CPU box: served, its decode steps ran 1.07x its profile and its
    prompt steps 1.08x (1.2-1.3x for chat-sized prompts, 1.0-1.1x for the long ones that
    weigh most in the fit); without the fits its simulated worker ran too fast where it was
    busy (TPOT p90 0.68-0.77x)."""
    fits = served_fits([o for *_, o in served], profile.step, profile.step)
    return (with_fit(profile, fits["decode"], fits["prompt"]),
            {"colocated": fits["decode"], "colocated_prompt": fits["prompt"]})
