"""Speculative decoding: proposers guess the next k tokens, one target forward verifies them.

    propose (n-gram lookup | draft model) ──> k draft tokens per request
    target forward over [last token, d1..dk] (one prefill-like chunk in the batch) ──> k+1 rows
    verify (argmax match / sampled match / rejection sampling) ──> accepted + 1 token
    roll back the rejected positions (num_computed_tokens, trailing blocks)

Only ``tandem.engine.spec.config`` is torch-free; the proposers and the verifier import torch.
"""
