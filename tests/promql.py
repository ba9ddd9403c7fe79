"""Reading the PromQL a dashboard or an alert rule holds, to check it names only series a real
process exports (tests/helm, tests/integration/test_metrics.py).

A query's metric names are its vector selectors' (``rate(x_bucket{...}[5m])`` names
``x_bucket``): compared with the sample names of a scrape, where a histogram is its
``_bucket``/``_sum``/``_count`` samples and a counter its ``_total``. Grafana's variables are
replaced first (``$__rate_interval`` by a duration; ``$var`` inside a label matcher's string
is text to PromQL).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import promql_parser

_GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*\w+\)$", re.S)


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` selects (raises ValueError when it does not parse, or when
    a selector names no metric: ``{job="x"}`` would match anything)."""
    for var in _GRAFANA_RANGES:
        expr = expr.replace(var, "5m")
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name is None:
                raise ValueError(f"a selector without a metric name in {expr!r}")
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of a Grafana dashboard;
    a ``label_values(selector, label)`` variable yields its selector."""
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(query.strip())
        if match is None:
            raise ValueError(f"variable {var['name']}: not label_values(selector, label)")
        yield f"variable {var['name']}", match["selector"]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def rule_queries(rule: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(alert or record name, PromQL) of every rule of a PrometheusRule object."""
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            yield r.get("alert") or r["record"], r["expr"]
