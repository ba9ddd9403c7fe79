"""How the served cluster behaves: load shapes, TTFT, hostile load, step overlap."""
