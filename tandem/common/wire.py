"""Constants and one-line formats that two processes must spell the same way.

    tandem/worker/router stdout:  TANDEM_READY {"role": "decode", "grpc": "127.0.0.1:50061", ...}
    gRPC trailing metadata on RESOURCE_EXHAUSTED:  retry-after-ms: "250"
        and, when the refusal is not for lack of room:  tandem-busy: "grammar" (the request's
        structured-output grammar is still compiling; a worker's and the router's to a client)
    gRPC trailing metadata of a worker's failure that is not its own:  tandem-fault: "receiver"
        (a prefill worker's push failed because its decode worker died, was drained or cannot
        be reached: the router moves the leg to another decode worker, keeps the prefill one)
    a client's own request id:  HTTP header X-Request-Id / gRPC metadata x-request-id (in,
        and echoed out with the router's id when the client sent none)

Launchers and tests wait for the READY line (never a fixed sleep); clients read the retry
hint to back off. Both ends import these names instead of spelling the strings.
"""

from __future__ import annotations

import json
from typing import Any

READY_MARKER = "TANDEM_READY"
RETRY_AFTER_KEY = "retry-after-ms"
FAULT_KEY = "tandem-fault"
RECEIVER_FAULT = "receiver"  # FAULT_KEY's value: the KV receiver failed, not the sender
# FAULT_KEY's value on a Decode stream that ended because its request left the batch for a
# live move (DecodeService.Suspend): nothing failed, the router moves or resumes it.
SUSPENDED_FAULT = "suspended"
BUSY_KEY = "tandem-busy"
GRAMMAR_BUSY = "grammar"  # BUSY_KEY's value: the request's grammar is still compiling
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_KEY = "x-request-id"  # gRPC metadata keys are lower case


def ready_line(info: dict[str, Any]) -> str:
    """The READY line (with its newline) announcing ``info``."""
    return f"{READY_MARKER} {json.dumps(info)}\n"


def parse_ready_line(line: str) -> dict[str, Any] | None:
    """The info of a READY line, or None for any other line (or one whose JSON is not a map)."""
    prefix = READY_MARKER + " "
    if not line.startswith(prefix):
        return None
    try:
        info = json.loads(line[len(prefix):])
    except json.JSONDecodeError:
        return None
    return info if isinstance(info, dict) else None

# Sequences one request may fork into (OpenAI's limit on ``n``): the router refuses more, and
# the engine and the KV COMMIT frame (one first token per sequence) bound theirs by it too.
MAX_SEQUENCES = 128
