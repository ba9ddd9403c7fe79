"""Pure-Python bookkeeping of the engine: requests, blocks, prefix cache, scheduling, the
remote-KV ledger (reserved and held blocks) and output processing (tokens, stops, outputs).

Nothing here imports torch, so all of it is unit-tested in milliseconds.
"""
