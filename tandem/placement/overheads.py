"""What each worker's prefills take beyond the cost model's prediction, learnt per worker.

The cost model (cost_model.py) predicts a prefill's compute from the worker's fitted step
costs; what it misses (the Prefill RPC, the KV push, the commit, and the fit's own error on the
host) is measured by the router after each placed prefill and folded in here. ``decide`` adds
each option's current figure to its prediction, so the remote and the local option are compared
corrected alike. Pure: no I/O; the caller passes its clock (``now``).
"""

from __future__ import annotations

from collections.abc import Mapping

# A learnt overhead halves for every this many seconds without a new observation.
OVERHEAD_HALF_LIFE_S = 60.0


class PrefillOverheads:
    """Per worker that prefilled, what its prefills took beyond the model's prediction at the
    decision, fitted as ``fixed + per_block * blocks`` (``blocks``: the prompt's KV blocks
    the decode worker lacked, what a remote prefill pushes).

    For a prefill worker that is its remote prefills' extra: the Prefill RPC, the KV push and
    the commit, plus wherever its served steps run longer or shorter than its reported fit.
    For a decode worker it is its local prefills' extra over the same kind of prediction. Both
    are learnt, so the comparison in ``cost_model.decide`` is between two corrected
    predictions; with only the remote side corrected, the fit's error on a host that slows
    every served step (measured: 1.1-1.3x on this project's 2-core box) counted against
    remote alone.

    A prefix-delta handoff pushes only the blocks after the decode worker's cached prefix,
    so one flat figure would charge a short delta the cost of a whole-prompt push (or the
    reverse). Each worker's two numbers are exponential moving averages over the prefills
    seen: the mean extra and mean block count, and their covariance over the blocks'
    variance for the slope (a one-variable least-squares fit with forgetting). Until the
    sizes vary the slope stays 0 and the mean stands for every size. Every measured extra
    goes in as it is, a negative one (faster than predicted) too: clipping each at 0 would
    turn the noise of single prefills into a standing penalty. :meth:`current` never
    answers below 0, so a correction only ever adds.

    A figure no prefill has renewed fades: given the time (``now``, seconds on the caller's
    clock), :meth:`current` halves it every ``half_life_s`` since that worker's last
    observation. Otherwise one bad spell could keep an option out for good: an option placed
    nowhere teaches nothing, so its penalty would never come down (at light load the other
    option, chosen every time, costs too little to force a change).
    """

    def __init__(self, weight: float = 0.2, half_life_s: float = OVERHEAD_HALF_LIFE_S) -> None:
        self._weight = weight
        self._half_life_s = half_life_s
        self._fits: dict[str, list[float]] = {}  # endpoint -> [mean x, mean y, var x, cov xy]
        self._seen: dict[str, float] = {}  # endpoint -> the ``now`` of its last observation

    def current(self, pushed_blocks: int = 0, now: float | None = None) -> Mapping[str, float]:
        """Seconds to add to each worker's predicted TTFT for a prompt of which the decode
        worker lacks ``pushed_blocks`` blocks (faded to ``now`` when given)."""
        return {endpoint: self._predict(fit, pushed_blocks) * self.fading(endpoint, now)
                for endpoint, fit in self._fits.items()}

    def fading(self, endpoint: str, now: float | None) -> float:
        """The factor :meth:`current` applies to ``endpoint``'s figure at ``now`` (1 without
        a time on either side)."""
        seen = self._seen.get(endpoint)
        if now is None or seen is None or now <= seen:
            return 1.0
        return 0.5 ** ((now - seen) / self._half_life_s)

    @staticmethod
    def _predict(fit: list[float], blocks: int) -> float:
        mx, my, vx, cxy = fit
        slope = max(cxy / vx, 0.0) if vx > 1e-9 else 0.0
        return max(my + slope * (blocks - mx), 0.0)

    def observe(self, endpoint: str, measured_s: float, predicted_s: float,
                pushed_blocks: int = 0, now: float | None = None) -> None:
        """Fold in one prefill on ``endpoint``: its measured time, the model's compute part
        predicted at the decision (``cost_model.Prediction.compute_s``) and its blocks;
        ``now``: when (the clock :meth:`current` is given)."""
        y, x = measured_s - predicted_s, float(pushed_blocks)
        if now is not None:
            self._seen[endpoint] = now
        fit = self._fits.get(endpoint)
        if fit is None:
            self._fits[endpoint] = [x, y, 0.0, 0.0]
            return
        w = self._weight
        mx, my, vx, cxy = fit
        dx, dy = x - mx, y - my
        mx += w * dx
        my += w * dy
        # West's weighted update: (co)variances about the moving means.
        vx = (1 - w) * (vx + w * dx * dx)
        cxy = (1 - w) * (cxy + w * dx * dy)
        self._fits[endpoint] = [mx, my, vx, cxy]

    def forget(self, endpoint: str) -> None:
        """A worker that left the pool (its replacement may sit elsewhere)."""
        self._fits.pop(endpoint, None)
        self._seen.pop(endpoint, None)
