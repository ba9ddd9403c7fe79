"""Pure-Python bookkeeping of the engine: requests, blocks, prefix cache, scheduling.

Nothing here imports torch, so all of it is unit-tested in milliseconds.
"""
