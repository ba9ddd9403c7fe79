"""Triton kernels behind ``TritonAttentionBackend``: one module per kernel plus its launcher.

``common`` holds the inner loop both attention kernels share (online softmax over paged K/V
tiles); ``write_kv``, ``decode`` and ``prefill`` each pair a ``@triton.jit`` kernel with the
host function that sizes its grid from tensor shapes and host lists only (no device syncs).
"""
