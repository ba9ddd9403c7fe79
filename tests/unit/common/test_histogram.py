"""Cumulative histograms (tandem/common/obs/histogram.py): differences between two readings."""

from __future__ import annotations

import math

from tandem.common.obs.histogram import histogram_delta


def test_histogram_delta_subtracts_readings_and_survives_a_reset() -> None:
    old = ((1.0, 80.0), (2.0, 95.0), (math.inf, 100.0))
    new = ((1.0, 90.0), (2.0, 115.0), (math.inf, 130.0))
    assert histogram_delta(old, new) == ((1.0, 10.0), (2.0, 20.0), (math.inf, 30.0))
    restarted = ((1.0, 5.0), (2.0, 5.0), (math.inf, 6.0))
    assert histogram_delta(old, restarted) == restarted  # counted from zero
    assert histogram_delta(None, new) == new
    assert histogram_delta(((5.0, 1.0), (math.inf, 1.0)), new) == new  # other bounds
