"""What one worker of a model on a device costs: the numbers the simulator and planner run on.

A profile is the engine's own step-cost model (tandem/common/step_costs.py: what every worker
fits online and the router's placement reads), extended by the attention term the router
leaves out, plus what bounds a worker besides time::

    step seconds = base + per_row * rows + per_prefill_token * prefill_tokens
                   + per_context_token * context_tokens + per_prefill_pair * prefill_pairs

    rows             decode rows in the step (one token each)
    prefill_tokens   prompt tokens computed in the step (whole prompts or chunks)
    context_tokens   KV positions the decode rows' attention reads: the sum of their context
                     lengths (memory-bound: each position's K and V are read once a step)
    prefill_pairs    query-key pairs of the step's prefill chunks: a chunk of n tokens after
                     o cached ones has n * o + n * (n + 1) / 2 (tandem/planner/fit.prefill_context);
                     the quadratic part of a long prompt, compute-bound, so it gets its own
                     coefficient (per pair it is far cheaper than a decode row's KV read)

Where one engine's step is not linear in its rows (a CPU's kernels change tiling at 8 rows,
a GPU's decode is memory-bound until the batch fills the tensor cores), ``StepCost.curve``
holds the measured seconds of a step by its total new tokens (decode rows + prompt tokens),
piecewise linear between the points, plus ``curve_per_row_s`` for each decode row (a row
costs more than a prompt token: its own attention launch, sampling, bookkeeping): these then
replace ``base + per_row * rows + per_prefill_token * prefill_tokens``, and the linear
coefficients stay as what the router's placement sees (workers report a linear fit;
tandem/common/step_costs.py).

A profile comes from ``tandem profile`` (measured on the real engine, ``source="measured"``)
or from tandem/planner/roofline.py (datasheet figures, ``source="roofline"``). It is plain JSON
(``SCHEMA``), so profiles travel between machines and into reviews.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA = "tandem.profile/1"


class ProfileError(ValueError):
    """A profile file that is missing fields, has the wrong schema, or impossible values."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds one engine step takes, linear in its shape (see the module docstring)."""

    base_s: float
    per_row_s: float
    per_prefill_token_s: float
    per_context_token_s: float = 0.0
    per_prefill_pair_s: float = 0.0
    # (total new tokens, seconds) at no context, ascending; () = the linear model above
    curve: tuple[tuple[float, float], ...] = ()
    curve_per_row_s: float = 0.0  # with a curve: what a decode row adds beyond its token

    def __post_init__(self) -> None:
        points = tuple((float(n), float(t)) for n, t in self.curve)
        object.__setattr__(self, "curve", points)
        if any(b[0] <= a[0] for a, b in zip(points, points[1:], strict=False)):
            raise ProfileError("curve points must have ascending token counts")
        if any(t < 0 or n <= 0 for n, t in points) or self.curve_per_row_s < 0:
            raise ProfileError("curve points need tokens > 0 and seconds >= 0")

    def shape_s(self, rows: int, prefill_tokens: int = 0) -> float:
        """The step's cost before attention: the curve at rows + prompt tokens when there
        is one (linear between points, the end segments extended), else the linear model."""
        c = self.curve
        if not c:
            return self.base_s + self.per_row_s * rows + self.per_prefill_token_s * prefill_tokens
        n = rows + prefill_tokens
        extra = self.curve_per_row_s * rows
        if len(c) == 1:
            return c[0][1] + extra
        i = 1
        while i < len(c) - 1 and c[i][0] < n:
            i += 1
        (n0, t0), (n1, t1) = c[i - 1], c[i]
        return max(t0 + (t1 - t0) * (n - n0) / (n1 - n0), 0.0) + extra

    def scaled(self, factor: float) -> StepCost:
        """Every cost of this step times ``factor`` (> 0): the same engine running that much
        slower, e.g. a served worker's steps against its profile."""
        if factor <= 0:
            raise ProfileError(f"a step scale must be > 0, not {factor}")
        return StepCost(self.base_s * factor, self.per_row_s * factor,
                        self.per_prefill_token_s * factor, self.per_context_token_s * factor,
                        self.per_prefill_pair_s * factor,
                        tuple((n, t * factor) for n, t in self.curve),
                        self.curve_per_row_s * factor)

    def step_s(self, rows: int, prefill_tokens: int = 0, context_tokens: int = 0,
               prefill_pairs: int = 0) -> float:
        """Predicted wall time of a step of this shape."""
        return (self.shape_s(rows, prefill_tokens) + self.per_context_token_s * context_tokens
                + self.per_prefill_pair_s * prefill_pairs)


@dataclass(frozen=True, slots=True)
class Transfer:
    """The KV handoff from a prefill to a decode worker: a fixed cost plus bytes at a rate."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0  # per handoff: Reserve, Prefill RPC and commit round trips

    def seconds(self, num_bytes: int) -> float:
        """Time to hand over ``num_bytes`` of KV (after the prefill's last layer)."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class Profile:
    """One worker (``gpus_per_worker`` devices) of ``model`` on ``device``.

    ``chunk_tokens`` is the engine's token budget per step (chunked prefill),
    ``max_num_seqs`` its row cap, ``kv_capacity_tokens`` the KV positions its cache holds
    (all requests together), ``block_size`` the tokens per KV block.
    """

    model: str
    device: str
    step: StepCost
    transfer: Transfer
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    chunk_tokens: int = 2048
    max_num_seqs: int = 256
    block_size: int = 16
    gpus_per_worker: int = 1
    # What serving adds to the engine alone (0 until calibrated against a real run:
    # bench/planner/validation.py --calibrate): seconds on every step of this worker (the
    # worker loop, token streaming, and on a shared CPU the other processes' claim on its
    # cores), and on every request's first token (the router's RPCs and the client hop).
    serving_step_s: float = 0.0
    serving_request_s: float = 0.0
    # A served step that carries prompt tokens (a decode worker's local prefill chunk) takes
    # this times what the rest of the model gives it (1 until fitted to a run's step logs:
    # bench/step_overlap.served_fits; measured on a 2-core CPU, a served decode worker ran
    # its decode steps at 0.96x its one-thread profile and its local prefill steps at 1.28x).
    serving_prompt_scale: float = 1.0
    source: str = "measured"  # "measured" or "roofline"
    notes: str = ""
    # Raw measurements behind the fit (measured profiles): kept for review, not read here.
    samples: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if min(self.step.base_s, self.step.per_row_s, self.step.per_prefill_token_s,
               self.step.per_context_token_s, self.step.per_prefill_pair_s) < 0:
            raise ProfileError("step costs must be >= 0")
        if self.step.base_s + self.step.per_prefill_token_s <= 0:
            raise ProfileError("a step must cost something (base_s or per_prefill_token_s > 0)")
        if self.transfer.bandwidth_bytes_per_s <= 0 or self.transfer.latency_s < 0:
            raise ProfileError("transfer bandwidth must be > 0 and latency >= 0")
        if self.serving_step_s < 0 or self.serving_request_s < 0:
            raise ProfileError("serving overheads must be >= 0")
        if not self.serving_prompt_scale > 0:
            raise ProfileError("serving_prompt_scale must be > 0")
        for name in ("kv_bytes_per_token", "kv_capacity_tokens", "chunk_tokens",
                     "max_num_seqs", "block_size", "gpus_per_worker"):
            if getattr(self, name) < 1:
                raise ProfileError(f"{name} must be >= 1")
        if self.source not in ("measured", "roofline"):
            raise ProfileError(f"source must be 'measured' or 'roofline', not {self.source!r}")

    def served_shape_s(self, rows: int, prefill_tokens: int = 0) -> float:
        """A served step's cost before attention: the engine's (``step.shape_s``) plus what
        the serving loop adds to every step (``serving_step_s``)."""
        return self.step.shape_s(rows, prefill_tokens) + self.serving_step_s

    @property
    def kv_capacity_blocks(self) -> int:
        """KV blocks the worker's cache holds."""
        return self.kv_capacity_tokens // self.block_size

    def to_json(self) -> dict[str, Any]:
        """The profile as a JSON object (with ``schema``)."""
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        """Parse :meth:`to_json`'s output; ProfileError naming what is wrong."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ProfileError(f"not a {SCHEMA} profile (schema={data.get('schema')!r})"
                               if isinstance(data, dict) else "a profile is a JSON object")
        body = {k: v for k, v in data.items() if k != "schema"}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ProfileError(f"unknown profile fields: {', '.join(unknown)}")
        try:
            body["step"] = StepCost(**body["step"])
            body["transfer"] = Transfer(**body["transfer"])
            return cls(**body)
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"bad profile: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Write the profile as indented JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile written by :meth:`save` (or by hand)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ProfileError(f"cannot read profile {path}: {exc}") from exc
        return cls.from_json(data)
