"""A Qwen3-style chat template over SmolLM2's tokenizer files, for the reasoning tests.

Qwen3's templates leave the thinking to the model (``<think>...</think>`` first in its
output) and, with ``enable_thinking: false``, write an empty ``<think>\\n\\n</think>\\n\\n``
into the prompt; Qwen3.5's (and DeepSeek-R1's) open ``<think>\\n`` themselves, so the output
holds only the closing tag. ``opens=True`` gives that second kind: a random-weight model's
output then starts inside the thinking, which is what an end-to-end test can count on.
``marker_tokens=True`` makes ``<think>`` and ``</think>`` one token each, as in Qwen3's and
DeepSeek-R1's vocabularies (added after SmolLM2's 49152 ids: ``THINK_ID``, ``END_THINK_ID``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

THINK_ID, END_THINK_ID = 49152, 49153  # with marker_tokens

TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false -%}
<think>

</think>

{% elif OPENS -%}
<think>
{% endif -%}
{%- endif -%}
"""


def thinking_tokenizer(source: Path, dest: Path, opens: bool,
                       marker_tokens: bool = False) -> Path:
    """``dest`` holding ``source``'s tokenizer with the Qwen3-style template."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, dest / name)
    if marker_tokens:
        tokenizer = json.loads((dest / "tokenizer.json").read_text())
        assert len(tokenizer["model"]["vocab"]) == THINK_ID
        tokenizer["added_tokens"] += [
            {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
            for i, text in ((THINK_ID, "<think>"), (END_THINK_ID, "</think>"))]
        (dest / "tokenizer.json").write_text(json.dumps(tokenizer))
    text = TEMPLATE.replace("OPENS", "true" if opens else "false")
    (dest / "chat_template.jinja").write_text(text)
    return dest
