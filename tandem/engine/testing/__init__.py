"""Helpers for tests and benchmarks: tiny random-weight checkpoints built from a config, with
every parameter perturbed away from transformers' initialisation."""

from tandem.engine.testing.perturb import perturb_parameters
from tandem.engine.testing.tiny import TINY_ARCHS, make_tiny_checkpoint

__all__ = ["TINY_ARCHS", "make_tiny_checkpoint", "perturb_parameters"]
