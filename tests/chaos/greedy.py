"""A chaos test's request and its reference: greedy token ids through the router, and the
prompt's ids for transformers' greedy (tests/unit/engine/_reference.py)."""

from __future__ import annotations

from pathlib import Path

from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc


def generate_ids(stub: tandem_pb2_grpc.TandemStub, text: str, max_tokens: int,
                 model: str = "") -> list[int]:
    """Greedy, ``ignore_eos``: the ``max_tokens`` ids the router streams for ``text`` (under
    the LoRA adapter ``model`` names, when it names one)."""
    sampling = tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = tandem_pb2.GenerateRequest(text=text, sampling=sampling, model=model)
    return [t for m in stub.Generate(request, timeout=300) for t in m.token_ids]


def prompt_ids(model: Path, text: str) -> list[int]:
    """``text`` tokenized as the router tokenizes it for ``model``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=True).encode(text)
