"""Pre-quantized Hugging Face checkpoints, loaded into our Int4Linear / Int8Linear exactly.

    config.json quantization_config.quant_method
      "awq"                 -> AwqFormat                 awq.py
      "gptq"                -> GptqFormat                gptq.py
      "compressed-tensors"  -> CompressedTensorsFormat   compressed_tensors.py
      "fp8"                 -> Fp8Format                 fp8.py
      absent                -> DENSE (nothing quantized; quantized-looking tensors are refused)
      anything else         -> ModelLoadError naming it and what is supported

Older AutoGPTQ / AutoAWQ exports keep the settings in ``quantize_config.json`` /
``quant_config.json`` beside config.json; those are read too. Each integer format unpacks a
linear's tensors into ``(q, scale, zero)`` (int4) or ``(q, scale)`` (int8) in our convention
(``unpacked.py``); tandem/engine/models/weights.py builds the layers straight from them, never
through float weights. FP8 keeps its e4m3 bytes and scales (``Fp8Weight``) for the native CPU
kernels, whatever the model's float dtype (``for_native_kernels``), and is dequantized at load
(``float_weight``) everywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.prequantized.awq import AwqFormat
from tandem.engine.quant.prequantized.base import (
    DENSE,
    SUPPORTED,
    PrequantizedFormat,
    TensorSource,
    unsupported,
)
from tandem.engine.quant.prequantized.compressed_tensors import CompressedTensorsFormat
from tandem.engine.quant.prequantized.fp8 import Fp8Format
from tandem.engine.quant.prequantized.gptq import GptqFormat
from tandem.engine.quant.prequantized.unpacked import (
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    build_linear,
    concat_rows,
)

_READERS = {
    "awq": AwqFormat.from_config,
    "gptq": GptqFormat.from_config,
    "compressed-tensors": CompressedTensorsFormat.from_config,
    "fp8": Fp8Format.from_config,
}
# Side files of older exports: file name -> the quant_method they imply.
_SIDE_FILES = {"quantize_config.json": "gptq", "quant_config.json": "awq"}


def read_quantization_config(path: Path) -> dict[str, Any] | None:
    """The checkpoint's quantization settings, with ``quant_method`` set; None when dense."""
    config = json.loads((path / "config.json").read_text())
    qc = config.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise ModelLoadError(f"{path}/config.json: quantization_config is not an object")
        return qc
    for name, method in _SIDE_FILES.items():
        side = path / name
        if side.is_file():
            return {"quant_method": method, **json.loads(side.read_text())}
    return None


def format_from_config(qc: dict[str, Any] | None) -> PrequantizedFormat:
    """The format reader for a ``quantization_config``; raises ModelLoadError if unsupported."""
    if qc is None:
        return DENSE
    method = str(qc.get("quant_method", "")).lower()
    if method not in _READERS:
        raise unsupported(method or "no quant_method", f"quant_method {method!r}")
    return _READERS[method](qc)


def detect_format(path: Path) -> PrequantizedFormat:
    """The format of the checkpoint directory at ``path`` (``DENSE`` when not quantized)."""
    return format_from_config(read_quantization_config(path))


__all__ = [
    "DENSE",
    "SUPPORTED",
    "AwqFormat",
    "CompressedTensorsFormat",
    "Fp8Format",
    "Fp8Weight",
    "GptqFormat",
    "Int4Weight",
    "Int8Weight",
    "PrequantizedFormat",
    "QuantizedWeight",
    "TensorSource",
    "build_linear",
    "concat_rows",
    "detect_format",
    "format_from_config",
    "read_quantization_config",
]
