"""bench/serving/load_shapes.py's rounds: rows are medians over rounds, ratios the median of
each round's own default-against-best."""

from __future__ import annotations

from bench.serving.load_shapes import median_ratios, median_rows
from bench.serving.load_shapes_report import table


def _fig(tok_s: float, itl_ms: float, errors: int = 0) -> dict:
    return {"output_tok_s": tok_s, "itl_p50_ms": itl_ms, "tpot_p50_ms": itl_ms,
            "ttft_p50_s": 1.0, "ttft_p90_s": 2.0, "errors": errors, "duration_s": 10.0,
            "error_sample": ["boom"] if errors else []}


ROUNDS = [  # the machine slows in round 2: every configuration drops together
    {"burst": {"default": _fig(300, 60), "colocated": _fig(330, 55)}},
    {"burst": {"default": _fig(200, 90, errors=1), "colocated": _fig(180, 95)}},
    {"burst": {"default": _fig(310, 58), "colocated": {"error": "RuntimeError: died"}}},
]


def test_rows_are_medians_over_the_rounds_that_ran() -> None:
    rows = median_rows(ROUNDS)["burst"]
    assert rows["default"]["output_tok_s"] == 300
    assert rows["default"]["itl_p50_ms"] == 60
    assert rows["default"]["errors"] == 1 and rows["default"]["error_sample"] == ["boom"]
    assert rows["default"]["rounds_tok_s"] == [300, 200, 310]
    assert rows["colocated"]["output_tok_s"] == 255  # median of the two rounds that ran
    assert rows["colocated"]["failed_rounds"] == 1


def test_ratios_pair_each_round_before_the_median() -> None:
    r = median_ratios(ROUNDS)["burst"]
    # per round: 300/330, 200/200 (default best), 310/310 (colocated failed): median 1.0
    assert r["rounds_default_vs_best_tok_s"] == [300 / 330, 1.0, 1.0]
    assert r["default_vs_best_tok_s"] == 1.0
    assert r["rounds_best_tok_s_config"] == ["colocated", "default", "default"]
    assert r["best_tok_s_config"] == "default"
    # the medians of the rows alone would say 300 / 255: pairing is what the rounds are for
    text = table({"rows": median_rows(ROUNDS), "ratios": {"burst": r}})
    assert "0.91x of colocated" in text and "300 / 200 / 310" in text


def test_a_row_failed_in_every_round_keeps_its_error() -> None:
    rounds = [{"steady": {"default": _fig(100, 20), "colocated": {"error": "x"}}}] * 2
    assert median_rows(rounds)["steady"]["colocated"] == {"error": "x"}
    assert median_ratios(rounds)["steady"]["default_vs_best_tok_s"] == 1.0
