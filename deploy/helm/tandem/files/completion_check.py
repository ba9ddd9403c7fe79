"""``helm test``: one completion through the router's Service; exits 1 unless it is a 200.

The chart's test Pod runs this file (templates/tests/completion.yaml) with the image's Python
and the standard library alone. Its settings come from the environment:

    TANDEM_URL            the router's HTTP API, http(s)://HOST:PORT
    TANDEM_MODEL          the served model id
    TANDEM_PROMPT         the prompt; TANDEM_MAX_TOKENS: tokens to generate
    TANDEM_TIMEOUT_S      seconds to wait for the answer
    TANDEM_API_KEY_FILE   optional: the router's key file (one key a line, # comments); the
                          first key is sent as a bearer token
    TANDEM_TLS_CERT       with https: the router's certificate (PEM, leaf first). The router
                          must show exactly this certificate, checked before anything is sent
                          (pinned: the name the Service is reached by need not be in it)
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import sys
import urllib.parse

PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def first_key(path: str) -> str:
    """The first key of a key file, read as the router reads it (tandem/router/auth.py)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            key = line.split("#", 1)[0].strip()
            if key:
                return key
    raise ValueError(f"no API key in {path}")


def pinned_leaf(path: str) -> bytes:
    """DER of the first certificate in a PEM file."""
    with open(path, encoding="ascii") as f:
        match = PEM_CERT.search(f.read())
    if match is None:
        raise ValueError(f"no certificate in {path}")
    return ssl.PEM_cert_to_DER_cert(match.group(0))


def connect(url: str, timeout: float, cert: str) -> tuple[http.client.HTTPConnection, str]:
    """An open connection to the router and the completions path; with https, only to a
    server showing the certificate in ``cert``."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port
    path = parts.path.rstrip("/") + "/v1/completions"
    if parts.scheme == "http":
        plain = http.client.HTTPConnection(host, port, timeout=timeout)
        plain.connect()
        return plain, path
    if parts.scheme != "https" or not cert:
        raise ValueError(f"{url}: need http://, or https:// with TANDEM_TLS_CERT")
    context = ssl.create_default_context()
    context.check_hostname = False  # the pin below is stricter than a name check
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    conn.connect()
    shown = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
    if shown != pinned_leaf(cert):
        conn.close()
        raise ValueError(f"{url} shows a certificate other than the one in {cert}")
    return conn, path


def main() -> int:
    """Send the completion; 0 on a 200 with a completion in it, else 1 (the reason on stderr)."""
    env = os.environ
    url = env["TANDEM_URL"]
    body = json.dumps({"model": env["TANDEM_MODEL"], "prompt": env["TANDEM_PROMPT"],
                       "max_tokens": int(env["TANDEM_MAX_TOKENS"])})
    headers = {"Content-Type": "application/json"}
    try:
        if env.get("TANDEM_API_KEY_FILE"):
            headers["Authorization"] = "Bearer " + first_key(env["TANDEM_API_KEY_FILE"])
        timeout = float(env["TANDEM_TIMEOUT_S"])
        conn, path = connect(url, timeout, env.get("TANDEM_TLS_CERT", ""))
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            status, text = response.status, response.read().decode("utf-8", "replace")
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        print(f"FAIL: POST {url}/v1/completions: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"FAIL: POST {url}/v1/completions: HTTP {status}: {text[:500]}",
              file=sys.stderr)
        return 1
    try:
        completion = json.loads(text)["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        completion = None
    if not isinstance(completion, str):
        print(f"FAIL: HTTP 200 without a completion: {text[:500]}", file=sys.stderr)
        return 1
    print(f"OK: HTTP 200 from {url}: {completion!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
