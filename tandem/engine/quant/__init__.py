"""Weight-only quantization of the linear layers and the int8 and fp8 KV caches.

    --quantization auto   (default) the checkpoint's own format: a GGUF's Q4_0/Q4_1/Q8_0
                          tensors as stored (tandem/engine/quant/gguf_blocks.py), embedding included
    --quantization none   dequantized weights in the model dtype
    --quantization int8   every Linear (lm_head too) -> Int8Linear, per output channel
    --quantization int4   decoder Linears -> Int4Linear, groups of 32 with scale + zero point
                          (taken straight from a Q4_1 GGUF's blocks when the model is one);
                          lm_head -> Int8Linear (a 49k-row int4 head costs too much quality)
    --quantization fp8    a checkpoint stored in FP8 (prequantized/fp8.py): e4m3 bytes in the
                          native CPU kernels (any float model dtype), dequantized elsewhere
    --kv-cache-dtype int8 the paged cache stores int8 + one fp32 scale per head vector
    --kv-cache-dtype fp8  the paged cache stores e4m3 over one scale for K and one for V in
                          each layer (kv_fp8.py): 1.0, or the checkpoint's calibrated
                          k_scale/v_scale of that layer (kv_scales.py)

On the CPU with the native kernels every quantized layer becomes a PackedLinear
(tandem/engine/native/packed_linear.py) run by tandem/engine/native for any number of rows. Without them,
CPU steps run torch's packed kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``)
on bf16 activations, and steps with many rows dequantize to fp32 and use the fp32 GEMM. On
CUDA a Triton kernel dequantizes in registers.
"""

from __future__ import annotations

from tandem.engine.quant.apply import QUANT_METHODS, QuantSummary, quantize_model, weight_bytes
from tandem.engine.quant.int4 import Int4Linear
from tandem.engine.quant.int8 import Int8Linear
from tandem.engine.quant.kv_int8 import Int8KVBackend

__all__ = [
    "QUANT_METHODS",
    "Int4Linear",
    "Int8KVBackend",
    "Int8Linear",
    "QuantSummary",
    "quantize_model",
    "weight_bytes",
]
