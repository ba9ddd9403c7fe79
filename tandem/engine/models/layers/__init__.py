"""The layers every family's forward is built from (one concept a file)."""

from tandem.engine.models.layers.attention import Attention
from tandem.engine.models.layers.mlp import MLP
from tandem.engine.models.layers.moe import SparseMoE, feed_forward
from tandem.engine.models.layers.norm import RMSNorm
from tandem.engine.models.layers.rotary import apply_rotary, rotary_tables

__all__ = ["MLP", "Attention", "RMSNorm", "SparseMoE", "apply_rotary", "feed_forward",
           "rotary_tables"]
