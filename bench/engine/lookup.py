"""The ``lookup`` workload of bench/engine/vs_transformers.py: single-stream decoding where prompt lookup pays.

Each prompt asks the model to edit or quote a document it is given, so most of the answer is
copied from the prompt. One greedy request at a time (batch 1), natural EOS or ``max_tokens``:

    ours plain | ours n-gram | ours draft (first layers) | transformers | transformers
                                                           generate()     prompt_lookup_num_tokens
Outputs are compared token for token: speculation must not change a single token.
"""

from __future__ import annotations

import time
from typing import Any

import torch

# also the document of tests/unit/engine/test_spec_smollm2.py
MOVING_AVERAGE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
_NOTE = (
    "The harbor reopens on Monday at seven in the morning. Fishing boats must register at "
    "the east office before they leave, and every crew needs a signed safety sheet. The "
    "north pier stays closed until the crane is repaired, so larger ships will dock at the "
    "south pier instead. Fuel is sold from eight until noon, and the cafe by the lighthouse "
    "opens again on Tuesday."
)
_CONFIG = '''server:
  host: 0.0.0.0
  port: 8080
  workers: 4
database:
  url: postgres://db.internal:5432/orders
  pool_size: 10
  timeout_s: 30
logging:
  level: info
  format: json
'''
TASKS = [
    "Rename the variable `total` to `running_sum` in this Python function. Show the whole "
    "function.\n\n" + MOVING_AVERAGE,
    "Fix the spelling and keep everything else the same:\n\n"
    + _NOTE.replace("register", "regster").replace("repaired", "repiared"),
    "Change the port to 9090 and the pool size to 20 in this YAML file. Show the whole "
    "file.\n\n" + _CONFIG,
    "Quote this paragraph exactly, then say in one sentence what it is about.\n\n" + _NOTE,
]


def lookup_prompts(tokenizer: Any, tasks: list[str] = TASKS) -> list[list[int]]:
    """The tasks (default: this workload's) as chat prompts (token ids)."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in tasks
    ]
    return [tokenizer.encode(t, add_special_tokens=True) for t in texts]  # as the engine does


def _ours(llm: Any, prompts: list[list[int]], max_tokens: int, speculative: bool
          ) -> tuple[float, list[list[int]]]:
    from tandem.engine import SamplingParams

    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, speculative=speculative)
    llm.engine.kv.pool.reset_prefix_cache()
    outs = []
    t0 = time.perf_counter()
    for prompt in prompts:  # single stream: one request at a time
        outs.append(llm.generate([prompt], p)[0].token_ids)
    return time.perf_counter() - t0, outs


@torch.inference_mode()
def _hf(model: Any, prompts: list[list[int]], max_tokens: int, lookup: int, ngram: int
        ) -> tuple[float, list[list[int]]]:
    extra = {"prompt_lookup_num_tokens": lookup, "max_matching_ngram_size": ngram} if lookup else {}
    outs = []
    t0 = time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=0, **extra)
        outs.append(out[0, len(prompt):].tolist())
    return time.perf_counter() - t0, outs


def run_lookup(model: str, dtype: str, hf: Any, max_tokens: int, k: int, ngram_max: int,
               ngram_min: int, draft_layers: int, draft_k: int, repeats: int) -> dict[str, Any]:
    """Tokens/s of each variant (best of ``repeats``), speedups, identity checks, spec stats."""
    from tandem.engine import LLM

    ngram = LLM(model=model, dtype=dtype, progress=False, speculative_method="ngram",
                num_speculative_tokens=k, ngram_max=ngram_max, ngram_min=ngram_min)
    draft = LLM(model=model, dtype=dtype, progress=False, speculative_method="draft",
                draft_layers=draft_layers, num_speculative_tokens=draft_k)
    prompts = lookup_prompts(ngram.engine.tokenizer)
    runs = {
        "ours_plain": lambda: _ours(ngram, prompts, max_tokens, False),
        "ours_ngram": lambda: _ours(ngram, prompts, max_tokens, True),
        "ours_draft": lambda: _ours(draft, prompts, max_tokens, True),
        "hf_plain": lambda: _hf(hf, prompts, max_tokens, 0, ngram_max),
        "hf_prompt_lookup": lambda: _hf(hf, prompts, max_tokens, k, ngram_max),
    }
    _ours(ngram, prompts[:1], 8, True)  # warm-up: one-time allocations and kernel choices
    _ours(draft, prompts[:1], 8, True)
    _hf(hf, prompts[:1], 8, k, ngram_max)
    before = {name: llm.engine.stats() for name, llm in (("ngram", ngram), ("draft", draft))}
    row: dict[str, Any] = {}
    outputs: dict[str, list[list[int]]] = {}
    for name, fn in runs.items():
        best = float("inf")
        for _ in range(repeats):
            dt, outs = fn()
            best = min(best, dt)
        outputs[name] = outs
        row[f"{name}_tok_s"] = sum(len(o) for o in outs) / best
    row["ngram_speedup"] = row["ours_ngram_tok_s"] / row["ours_plain_tok_s"]
    row["draft_speedup"] = row["ours_draft_tok_s"] / row["ours_plain_tok_s"]
    row["hf_lookup_speedup"] = row["hf_prompt_lookup_tok_s"] / row["hf_plain_tok_s"]
    want = outputs["ours_plain"]
    for name in ("ours_ngram", "ours_draft", "hf_plain", "hf_prompt_lookup"):
        row[f"{name}_identical"] = outputs[name] == want
    row["output_tokens"] = sum(len(o) for o in want)
    for name, llm in (("ngram", ngram), ("draft", draft)):  # over the timed runs only
        st, st0 = llm.engine.stats(), before[name]
        proposed = st.spec_proposed_tokens - st0.spec_proposed_tokens
        accepted = st.spec_accepted_tokens - st0.spec_accepted_tokens
        steps = st.spec_num_steps - st0.spec_num_steps
        row[f"{name}_acceptance_rate"] = accepted / proposed if proposed else 0.0
        row[f"{name}_tokens_per_step"] = 1 + accepted / steps if steps else 0.0
    return row
