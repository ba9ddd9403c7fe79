"""The router's OpenAI-compatible HTTP API (aiohttp, in the router's own event loop)."""

from tandem.router.http.server import HttpServer

__all__ = ["HttpServer"]
