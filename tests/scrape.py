"""Reading Prometheus text in tests: parse with the official parser, index the samples, check
the naming rules of docs/design.md section 5 (``tandem_`` prefix, a ``role`` label; vLLM's names,
``vllm:``, where a process exports them too: docs/metrics.md)."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
PREFIXES = ("tandem_", "vllm:")


def parse(text: str) -> Samples:
    """Every sample, keyed by (sample name, its labels); asserts the naming rules hold."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith(PREFIXES), family.name
        for s in family.samples:
            assert "role" in s.labels, (s.name, s.labels)
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels`` (KeyError when missing)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    if len(found) != 1:
        raise KeyError(f"{name} {labels}: {len(found)} samples")
    return found[0]


def fetch(address: str, path: str = "/metrics", timeout: float = 30.0, *,
          ca: Path | None = None, api_key: str | None = None) -> str:
    """GET http://address/path as text (raises on a non-200 reply); with ``ca``, https
    trusting that CA, and with ``api_key``, as a bearer of that key (a router's TLS edge)."""
    scheme, context = ("https", ssl.create_default_context(cafile=str(ca))) if ca else ("http", None)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(f"{scheme}://{address}{path}", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return reply.read().decode()
