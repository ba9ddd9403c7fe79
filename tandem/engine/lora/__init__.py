"""Multi-LoRA serving: PEFT adapters on q/k/v/o and gate/up/down, several in one batch.

    config.py   LoraConfig (vLLM's flags), adapter names, --lora-modules values (no torch:
                the engine's config imports it)
    adapter.py  a PEFT directory read strictly and fused for the engine's projections
    batch.py    a step's rows grouped by adapter and the gather-matmul delta
    triton_lora.py  the same delta on CUDA: segmented shrink/expand Triton kernels per slot
    manager.py  the registered adapters, a step's slots, the forward hooks, the prefix-cache
                salt (the fused native CPU forward adds the deltas itself from the same
                slots: tandem/engine/native/lora_step.py)
"""

from tandem.engine.lora.config import LoraConfig, check_name, parse_module

__all__ = ["LoraConfig", "check_name", "parse_module"]
