"""The router's two ports: gRPC (``--port``) and the OpenAI HTTP API (``--http-port``).

vLLM's ``--port`` is its HTTP port; here it is the router's gRPC port, and the HTTP API
defaults to 8000. A vLLM user's ``--port 8000`` would make both ports one: rather than fail
at bind time, the HTTP API then takes a free port and the command says so. The router and
the launchers (``tandem local``, ``tandem up``) apply the same rule:

    --port      --http-port     HTTP port
    0           (not given)     a free one
    8000        (not given)     a free one (a notice; the endpoint is printed once serving)
    P           (not given)     8000
    P (P > 0)   P               refused: one port cannot serve both
    any         H               H
"""

from __future__ import annotations

DEFAULT_HTTP_PORT = 8000


def router_http_port(grpc_port: int, http_port: int | None) -> tuple[int, str]:
    """(the HTTP port to bind, 0 for a free one; a notice to show the user, "" for none).
    ValueError when ``http_port`` is the fixed ``grpc_port`` too."""
    if http_port is not None:
        if http_port == grpc_port and grpc_port > 0:
            raise ValueError(f"--http-port {http_port} is also the router's gRPC --port: "
                             "give them different ports")
        return int(http_port), ""
    if grpc_port == DEFAULT_HTTP_PORT:
        return 0, (f"--port {grpc_port} is the router's gRPC port and the HTTP API's default: "
                   "the HTTP API takes a free port, printed once serving (--http-port picks "
                   "one)")
    return (0 if grpc_port == 0 else DEFAULT_HTTP_PORT), ""
