"""How fast is one engine: steps, kernels, KV cache, against transformers."""
