"""What a user's script does around a server it started: GET a health path, poll until a
condition holds, send one completion that must be served (no retry). Shared by the tests
that start ``tandem local`` / ``tandem up`` the way users do."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.integration.served_model import MODEL_ID


def get(http: str, path: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of GET ``path`` on ``http`` (HOST:PORT); status 0 while nothing
    listens there yet."""
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


def until(cond: Callable[[], bool], timeout: float, what: str,
          alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``cond`` (a client's wait loop) until it holds; fail if ``alive`` turns False."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert alive(), f"exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def complete(http: str, model: str = MODEL_ID, max_tokens: int = 4) -> dict[str, Any]:
    """One completion over HTTP, no retry: it must be served (a 503 fails the test)."""
    body = json.dumps({"model": model, "prompt": "Hello there", "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"http://{http}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            assert reply.status == 200
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{err.code}: {err.read()!r}") from err
