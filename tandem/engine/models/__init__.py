"""Model definitions: our own forward for the Llama family over the paged KV cache."""

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "ModelArch"]
