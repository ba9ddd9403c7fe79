"""One disaggregated request through real processes is one trace (issue 19's done-when).

The shared tiny prefill and decode workers run with ``--trace-file`` (tests/integration/
conftest.py); this module's router does too, with JSON logs. One HTTP request, prefilled on
the prefill worker (``--placement remote``) and decoded on the decode worker, carries a
client ``traceparent`` and ``X-Request-Id``. Each process writes only its own spans, so the
trace is put together from the three files: every span has the client's trace id, the
router's ``request`` span is the child of the client's span, each worker's span for a call
is the child of the router's span for that call, and the prefill worker's engine, push and
commit spans hang under its call. The router's log lines during the request name it.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.sdk_cluster import MODEL_ID, assert_idle, wait_until
from tests.integration.served_model import TinyWorkers, shared_router


def _spans(path: Path, trace_id: str) -> dict[str, list[dict[str, Any]]]:
    """The spans of ``trace_id`` in a trace file, by name."""
    out: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["trace_id"] == trace_id:
                out.setdefault(record["name"], []).append(record)
    return out


def _one(spans: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    (span,) = spans[name]
    return span


def test_one_disaggregated_request_is_one_trace_across_three_processes(
        tiny_workers: TinyWorkers, tmp_path: Path) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    router_file = tmp_path / "router.jsonl"
    with shared_router(tiny_workers, "--prefill", tiny_workers.prefill.grpc,
                       "--placement", "remote", "--trace-file", str(router_file),
                       "--log-format", "json", "--log-level", "DEBUG") as router:
        request = urllib.request.Request(
            f"http://{router.info['http']}/v1/completions",
            data=json.dumps({"model": MODEL_ID, "prompt": "Tell me about the sea",
                             "max_tokens": 4, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": "it-trace-1",
                     "traceparent": f"00-{trace_id}-{client_span}-01"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.headers["X-Request-Id"] == "it-trace-1"
            assert json.load(response)["usage"]["completion_tokens"] == 4
        # Each process writes a span when it ends; the decode worker's stream span may end a
        # moment after the router answered.
        files = {"router": router_file, **tiny_workers.trace_files}
        wanted = {"router": "request", "prefill": "kv.push", "decode": "DecodeService/Decode"}
        wait_until(lambda: all(wanted[p] in _spans(files[p], trace_id) for p in files), 60)
        assert_idle(tiny_workers)  # type: ignore[arg-type]
        log = list(router.log)

    on = {p: _spans(f, trace_id) for p, f in files.items()}
    services = {p: {s["service"] for spans in on[p].values() for s in spans} for p in on}
    assert services == {"router": {"tandem-router"}, "prefill": {"tandem-prefill"},
                        "decode": {"tandem-decode"}}

    r = on["router"]
    root = _one(r, "request")
    assert root["parent_span_id"] == client_span and root["remote_parent"]
    for name in ("admission", "tokenize", "placement", "DecodeService/Reserve",
                 "PrefillService/Prefill", "DecodeService/Decode"):
        assert _one(r, name)["parent_span_id"] == root["span_id"], name
    assert _one(r, "placement")["attributes"]["tandem.decision"] == "remote"

    # Each worker's span for a call is the child of the router's span for that call.
    for worker, name in (("decode", "DecodeService/Reserve"), ("prefill", "PrefillService/Prefill"),
                         ("decode", "DecodeService/Decode")):
        server, client = _one(on[worker], name), _one(r, name)
        assert (server["kind"], client["kind"]) == ("SERVER", "CLIENT"), name
        assert server["parent_span_id"] == client["span_id"] and server["remote_parent"], name
        assert server["status"] == "UNSET", (name, server["status_message"])
        assert server["attributes"]["tandem.leg_id"] == root["attributes"]["tandem.request_id"]

    p = on["prefill"]
    call = _one(p, "PrefillService/Prefill")
    engine, push, commit = _one(p, "prefill.engine"), _one(p, "kv.push"), _one(p, "kv.commit")
    assert engine["parent_span_id"] == push["parent_span_id"] == call["span_id"]
    assert commit["parent_span_id"] == push["span_id"]
    layers = json.loads((tiny_workers.model / "config.json").read_text())["num_hidden_layers"]
    assert push["attributes"]["tandem.layers_pushed"] == layers and push["attributes"]["tandem.bytes"]

    # The router's log: JSON lines only; those of the request name it, the client and trace.
    records = [json.loads(line) for line in log if not line.startswith("TANDEM_READY")]
    mine = [rec for rec in records if rec.get("request_id") == root["attributes"][
        "tandem.request_id"]]
    assert any(rec["message"].startswith("finished (length): ") for rec in mine)
    assert all(rec["client_request_id"] == "it-trace-1" and rec["trace_id"] == trace_id
               and rec["service"] == "router" for rec in mine)
