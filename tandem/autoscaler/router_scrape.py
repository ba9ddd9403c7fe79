"""The router's Prometheus text as a ``RouterSample`` (tandem/router/metrics.py's names).

    tandem_time_to_first_token_seconds     histogram  arrival -> first token
    tandem_time_per_output_token_seconds   histogram  per finished request
    tandem_prompt_tokens_total             counter    prompt tokens of admitted requests
    tandem_generation_tokens_total         counter    tokens streamed to clients
    tandem_num_requests_waiting / _running gauges     the admission queue, in flight
    tandem_request_queue_time_seconds_count          requests admitted
    tandem_request_generation_tokens_count / _sum    requests finished, their tokens

Only ``role="router"`` series count. A metric the text lacks stays empty (an older router):
the window then has no router figure of that kind and the policies use the workers' own.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tandem.autoscaler.metrics import RouterSample

TTFT = "tandem_time_to_first_token_seconds"
TPOT = "tandem_time_per_output_token_seconds"
_COUNTERS = {"tandem_prompt_tokens_total": "prompt_tokens_total",
             "tandem_generation_tokens_total": "output_tokens_total",
             "tandem_request_queue_time_seconds_count": "admitted_total",
             "tandem_request_generation_tokens_count": "finished_total",
             "tandem_request_generation_tokens_sum": "finished_tokens_total"}
_GAUGES = {"tandem_num_requests_waiting": "waiting", "tandem_num_requests_running": "running"}


class RouterScrapeError(ValueError):
    """The text is not Prometheus exposition format."""


def router_sample(text: str) -> RouterSample:
    """A RouterSample from the router's ``/metrics`` text."""
    buckets: dict[str, list[tuple[float, float]]] = {TTFT: [], TPOT: []}
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("role", "router") != "router":
                    continue
                base = s.name[: -len("_bucket")] if s.name.endswith("_bucket") else ""
                if base in buckets:
                    buckets[base].append((float(s.labels["le"]), float(s.value)))
                elif s.name in _COUNTERS:
                    values[_COUNTERS[s.name]] = float(s.value)
                elif s.name in _GAUGES:
                    values[_GAUGES[s.name]] = float(s.value)
    except (ValueError, KeyError) as exc:
        raise RouterScrapeError(f"not Prometheus text: {exc}") from exc
    return RouterSample(ttft=tuple(sorted(buckets[TTFT])), tpot=tuple(sorted(buckets[TPOT])),
                        **values)
