"""What a process's ``/metrics`` serves: its own ``tandem_*`` instruments, every series labelled
with the served model, plus vLLM's names for the figures whose meaning is the same.

    instruments (a CollectorRegistry: tandem_* names, ``role`` label)
        ──ExportView──> every family, ``model_name="<served id>"`` added to each sample
                        + for each family in ``aliases``: the same samples under vLLM's name
                          (``vllm:time_to_first_token_seconds_bucket{model_name=...,role=...}``)

The aliases are a render-time view: nothing is observed twice, and a scrape sees both names
move together. Colons are valid in Prometheus metric names (vLLM's ``vllm:`` prefix) and
prometheus_client renders them as they are. Which tandem family stands for which vLLM name is
each process's own table (tandem/router/metrics.py, tandem/worker/metrics.py), documented in
docs/metrics.md: only figures that mean what vLLM's mean are aliased.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

MODEL_LABEL = "model_name"  # vLLM's label for the served model id
COMPAT_VLLM, COMPAT_NONE = "vllm", "none"
COMPAT_CHOICES = (COMPAT_VLLM, COMPAT_NONE)

# A tandem family name -> the vLLM family names it is also exported under.
Aliases = Mapping[str, tuple[str, ...]]


def add_metrics_compat_arg(parser: argparse.ArgumentParser) -> None:
    """``--metrics-compat {vllm,none}``: also export vLLM's metric names (the default)."""
    parser.add_argument(
        "--metrics-compat", choices=COMPAT_CHOICES, default=COMPAT_VLLM,
        help="vllm (default): /metrics also carries vLLM's names (vllm:*) for the figures "
        "that mean the same, so dashboards, alerts and autoscalers written for vLLM work; "
        "none: tandem_* names only (docs/metrics.md)")


class ExportView(Collector):
    """``source``'s families with ``model_name`` on every sample, plus their ``aliases``."""

    def __init__(self, source: CollectorRegistry, model_name: str, aliases: Aliases) -> None:
        self._source = source
        self._labels = {MODEL_LABEL: model_name} if model_name else {}
        self._aliases = aliases

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            labelled = _relabel(family, family.name, self._labels)
            yield labelled
            for alias in self._aliases.get(family.name, ()):
                yield _relabel(labelled, alias, {})


def export_registry(source: CollectorRegistry, model_name: str, compat: str,
                    aliases: Aliases) -> CollectorRegistry:
    """The registry ``/metrics`` renders: ``ExportView`` over ``source``; the aliases only
    when ``compat`` is "vllm". Raises ValueError on an unknown ``compat``."""
    if compat not in COMPAT_CHOICES:
        raise ValueError(f"metrics compat {compat!r}: expected one of {', '.join(COMPAT_CHOICES)}")
    view = CollectorRegistry(auto_describe=True)
    view.register(ExportView(source, model_name, aliases if compat == COMPAT_VLLM else {}))
    return view


def _relabel(family: Metric, name: str, labels: Mapping[str, str]) -> Metric:
    """``family`` renamed to ``name`` (each sample's suffix kept: _total, _bucket, _created)
    with ``labels`` added to every sample (a label the sample has already wins)."""
    out = Metric(name, family.documentation, family.type, family.unit)
    cut = len(family.name)
    out.samples = [
        s._replace(name=name + s.name[cut:], labels={**labels, **s.labels})
        for s in family.samples
    ]
    return out
