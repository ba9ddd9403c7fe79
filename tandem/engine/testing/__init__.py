"""Helpers for tests and benchmarks: tiny random-weight checkpoints built from a config."""

from tandem.engine.testing.tiny import TINY_ARCHS, make_tiny_checkpoint

__all__ = ["TINY_ARCHS", "make_tiny_checkpoint"]
