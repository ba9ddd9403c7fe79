"""lm-evaluation-harness through the HTTP API scores exactly as lm-eval's own ``hf`` backend on
the same weights: a router + prefill + decode (tiny model, SmolLM2's tokenizer, placement
remote) behind lm-eval's ``local-completions`` model, against transformers in-process.

    tandem_capitals    multiple_choice  echo + logprobs, max_tokens 1: the prompt tokens'
                                        logprobs, token_logprobs[ctxlen:-1] summed per choice
    tandem_arithmetic  generate_until   greedy, stop "\\n" or ".", at most 8 tokens

Both tasks are local JSONL files (tests/data/lm_eval/), and the hub is off: nothing is
fetched. Per sample, the choices' logprobs agree to float tolerance and acc and the
generated text exactly; one run sends a batch of prompts per request (lm-eval's
``batch_size``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.launcher.local_cluster import Proc
from tests.integration.served_model import TinyWorkers

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = ROOT / "tests" / "data" / "lm_eval"  # the YAMLs name their data from ROOT
MC, GEN = "tandem_capitals", "tandem_arithmetic"
MODEL = "tiny"
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _num_docs(task_file: str) -> int:
    return len((TASKS_DIR / task_file).read_text().splitlines())


@pytest.fixture(scope="module")
def model(tiny_workers: TinyWorkers) -> Path:
    return tiny_workers.model


@pytest.fixture(scope="module")
def base_url(tiny_router: Proc) -> str:
    """The shared router + prefill + decode on the tiny model (tests/integration/conftest.py)."""
    return f"http://{tiny_router.info['http']}/v1/completions"


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No hub, no download counts, a private datasets cache; lm-eval runs from ROOT.

    datasets and huggingface_hub read these variables once, at import, which an earlier test
    may have done: their copies are set too."""
    import datasets
    import huggingface_hub

    with pytest.MonkeyPatch.context() as mp:
        for name in OFFLINE:
            mp.setenv(name, "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        mp.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        mp.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False)
        mp.setattr(datasets.config, "HF_DATASETS_CACHE",
                   tmp_path_factory.mktemp("hf-datasets"))
        mp.chdir(ROOT)
        yield


def _evaluate(model: str, model_args: str, batch_size: int) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=[MC, GEN], batch_size=batch_size,
        device="cpu", log_samples=True,
        # Only these tasks: indexing lm-eval's ~13,000 built-in YAMLs takes longer than a run.
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False))
    assert out is not None
    return out


@pytest.fixture(scope="module")
def reference(model: Path) -> dict[str, Any]:
    """lm-eval's transformers backend on the served checkpoint, on one thread (as the
    workers run: more only contend on a model this small)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _evaluate("hf", f"pretrained={model},dtype=float32", batch_size=1)
    finally:
        torch.set_num_threads(threads)


def _served(base_url: str, model: Path, batch_size: int) -> dict[str, Any]:
    args = {"model": MODEL, "base_url": base_url, "tokenizer": model,
            "tokenizer_backend": "huggingface", "tokenized_requests": True,
            "num_concurrent": 1, "max_retries": 1, "timeout": 120}
    return _evaluate("local-completions", ",".join(f"{k}={v}" for k, v in args.items()),
                     batch_size)


def _by_doc(out: dict[str, Any], task: str) -> list[dict[str, Any]]:
    return sorted(out["samples"][task], key=lambda s: s["doc_id"])


def _assert_same_as_reference(out: dict[str, Any], reference: dict[str, Any]) -> None:
    for task in (MC, GEN):
        assert out["results"][task] == reference["results"][task], task
    samples, expected = _by_doc(out, MC), _by_doc(reference, MC)
    assert len(samples) == _num_docs("capitals.jsonl")
    for got, want in zip(samples, expected, strict=True):
        logprobs = [lp for lp, _ in got["filtered_resps"]]
        assert len(logprobs) == 4 and all(math.isfinite(lp) for lp in logprobs), got
        # the workers' default float16 KV cache: K and V rounded to ~3 significant digits,
        # ~5e-4 from transformers' float32 attention here (1e-4 with --kv-cache-dtype float32)
        assert logprobs == pytest.approx([lp for lp, _ in want["filtered_resps"]], abs=2e-3)
        assert (got["acc"], got["acc_norm"]) == (want["acc"], want["acc_norm"]), got["doc_id"]
    samples, expected = _by_doc(out, GEN), _by_doc(reference, GEN)
    assert len(samples) == _num_docs("arithmetic.jsonl")
    texts = [s["filtered_resps"][0] for s in samples]
    assert texts == [s["filtered_resps"][0] for s in expected]
    assert any(texts), "every generation came back empty"


def test_local_completions_scores_as_hf(base_url: str, model: Path,
                                        reference: dict[str, Any]) -> None:
    _assert_same_as_reference(_served(base_url, model, batch_size=1), reference)


def test_batched_prompts_score_the_same(base_url: str, model: Path,
                                        reference: dict[str, Any]) -> None:
    # 8 prompts per /v1/completions request: lists of token-id lists, choices by index.
    _assert_same_as_reference(_served(base_url, model, batch_size=8), reference)
