"""A Kubernetes API server double for pods: real HTTP, the real list and watch protocol.

Serves ``GET /api/v1/namespaces/{ns}/pods`` on localhost:

- without ``watch``: a ``PodList`` with ``metadata.resourceVersion``, filtered by
  ``labelSelector`` (``key in (a,b)`` and ``key=value`` terms, comma-joined);
- with ``watch=true&resourceVersion=RV``: a chunked stream of newline-delimited JSON events
  (ADDED / MODIFIED / DELETED) newer than RV, held open until ``timeoutSeconds`` or until the
  test expires watches, which ends every open watch with an ERROR event carrying a 410 Status
  and makes every older resourceVersion "too old" (a client must LIST again).

Tests change pods through ``put`` and ``delete``; every change gets the next resourceVersion.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")


def make_pod(
    name: str,
    role: str,
    ip: str | None = None,
    ready: bool = False,
    port: int = 7000,
    annotate_port: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod as the API returns it (only the fields discovery reads, plus a few real ones)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "tandem",
        "uid": f"uid-{name}",
        "labels": {"app.kubernetes.io/name": "tandem", "app.kubernetes.io/component": role},
    }
    if annotate_port:
        meta["annotations"] = {"tandem.dev/grpc-port": str(port)}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ports = [] if annotate_port else [{"name": "grpc", "containerPort": port, "protocol": "TCP"}]
    status: dict[str, Any] = {
        "phase": "Running" if ip else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {"containers": [{"name": role, "image": "tandem:test", "ports": ports}]},
        "status": status,
    }


class KubeApiDouble:
    """Pods in one store with a resourceVersion history; start() serves them over HTTP."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._rv = 100
        self._oldest_valid = 0  # resourceVersions below this get 410 Gone
        self._expire_generation = 0
        self._closed = False
        self.fail_next: list[int] = []  # HTTP statuses to answer the next requests with
        self.requests: list[dict[str, list[str]]] = []  # query of every pods request
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL for a kubernetes client Configuration."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> KubeApiDouble:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """End every watch and stop serving."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def put(self, pod: dict[str, Any], namespace: str = "tandem", compacted: bool = False) -> None:
        """Create or update a pod (ADDED or MODIFIED). ``compacted``: its event is already
        compacted out of the history, so only a LIST shows the change (use with
        ``expire_watches``)."""
        key = (namespace, pod["metadata"]["name"])
        with self._cond:
            kind = "MODIFIED" if key in self._pods else "ADDED"
            self._record(kind, key, copy.deepcopy(pod), compacted)

    def delete(self, name: str, namespace: str = "tandem") -> None:
        """Delete a pod (DELETED)."""
        with self._cond:
            pod = self._pods.pop((namespace, name))
            self._record("DELETED", (namespace, name), pod)

    def expire_watches(self) -> None:
        """Compact history: open watches end with 410 Gone and old versions are refused."""
        with self._cond:
            self._oldest_valid = self._rv + 1
            self._expire_generation += 1
            self._cond.notify_all()

    def watchers(self) -> int:
        """How many watch requests were made so far."""
        return sum(1 for q in self.requests if q.get("watch") == ["true"])

    def _record(
        self, kind: str, key: tuple[str, str], pod: dict[str, Any], compacted: bool = False
    ) -> None:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        if kind != "DELETED":
            self._pods[key] = pod
        if not compacted:
            self._events.append((self._rv, kind, copy.deepcopy(pod)))
        self._cond.notify_all()

    def list(self, namespace: str, selector: str) -> dict[str, Any]:
        with self._cond:
            items = [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self._pods.items())
                if ns == namespace and selector_matches(selector, p)
            ]
            return {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def watch(self, namespace: str, selector: str, since: int, timeout_s: float, send: Any) -> None:
        """Stream events after ``since`` until timeout, expiry or close."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            generation = self._expire_generation
            if since < self._oldest_valid - 1:
                send(_gone(since))
                return
        while True:
            with self._cond:
                pending = [
                    (rv, kind, pod)
                    for rv, kind, pod in self._events
                    if rv > since
                    and pod["metadata"].get("namespace", namespace) == namespace
                    and selector_matches(selector, pod)
                ]
                if not pending:
                    remaining = deadline - time.monotonic()
                    expired = generation != self._expire_generation
                    if self._closed or remaining <= 0:
                        return
                    if expired:
                        send(_gone(since))
                        return
                    self._cond.wait(remaining)
                    continue
            for rv, kind, pod in pending:
                send({"type": kind, "object": pod})
                since = rv


def _gone(since: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": f"too old resource version: {since}",
            "reason": "Expired",
            "code": 410,
        },
    }


def selector_matches(selector: str, pod: dict[str, Any]) -> bool:
    """Whether a pod's labels satisfy a label selector (`k in (a,b)` and `k=v` terms)."""
    labels = pod["metadata"].get("labels") or {}
    # Split on commas outside parentheses: "a in (x,y),b=c" -> ["a in (x,y)", "b=c"].
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if not term:
            continue
        found = re.fullmatch(r"(\S+)\s+in\s+\(([^)]*)\)", term)
        if found:
            values = {v.strip() for v in found.group(2).split(",")}
            if labels.get(found.group(1)) not in values:
                return False
            continue
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


def _handler(api: KubeApiDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
            return

        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            url = urlparse(self.path)
            found = _PATH.match(url.path)
            query = parse_qs(url.query)
            if found is None:
                self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            api.requests.append(query)
            if api.fail_next:
                code = api.fail_next.pop(0)
                self._json(code, {"kind": "Status", "code": code, "reason": "InternalError"})
                return
            namespace, selector = found.group(1), query.get("labelSelector", [""])[0]
            if query.get("watch") != ["true"]:
                self._json(200, api.list(namespace, selector))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            timeout_s = float(query.get("timeoutSeconds", ["30"])[0])
            try:
                api.watch(namespace, selector, since, timeout_s, self._chunk)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass  # the client went away (stopped watching)
            self.close_connection = True

        def _chunk(self, event: dict[str, Any]) -> None:
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
