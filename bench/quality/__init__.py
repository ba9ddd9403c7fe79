"""Does a technique keep the output: perplexity, quantized KV caches."""
