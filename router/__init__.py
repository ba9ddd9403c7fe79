"""Tandem's router: the public gRPC front door, the worker registry, routing and the handoff.

Imports protos and a tokenizer only (never torch or the engine): everything here is
bookkeeping and I/O, so it starts fast and runs anywhere.
"""
