"""How fast KV moves: our transports against raw sockets and memcpy."""
