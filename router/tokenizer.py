"""The router's tokenizer: a local transformers tokenizer (never fetched from a hub)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from protos.tandem.v1 import tandem_pb2
from router.errors import InvalidRequestError


class TokenizerLoadError(RuntimeError):
    """The tokenizer directory is missing or unreadable."""


class RouterTokenizer:
    """Encodes prompts (text or chat), decodes output ids, and knows the vocabulary size.

    ``backend`` is the ``tokenizers.Tokenizer`` underneath, what ``common.detokenizer``
    decodes output streams with (so a directory needs a fast tokenizer).

    ``vocab_size`` is the larger of the tokenizer's size and the model config's ``vocab_size``
    (when the directory has a config.json): any id the model can embed is a valid prompt id.
    """

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        if not path.is_dir():
            raise TokenizerLoadError(f"tokenizer directory {str(path)!r} does not exist")
        try:
            self._tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
                str(path), local_files_only=True
            )
        except (OSError, ValueError) as err:
            raise TokenizerLoadError(f"cannot load a tokenizer from {str(path)!r}: {err}") from err
        backend = getattr(self._tok, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise TokenizerLoadError(f"the tokenizer in {str(path)!r} is not a fast tokenizer")
        self.backend: Tokenizer = backend
        self.vocab_size = max(len(self._tok), _config_vocab_size(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a raw text prompt (special tokens added as the engine adds them)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_chat(self, chat: tandem_pb2.ChatMessages) -> list[int]:
        """Token ids of chat messages rendered through the tokenizer's chat template."""
        if not getattr(self._tok, "chat_template", None):
            raise InvalidRequestError("chat", "this model has no chat template")
        messages = [{"role": m.role, "content": m.content} for m in chat.messages]
        rendered = self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=(
                chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
            )
        )
        # The template already wrote any special tokens it wants.
        return self.encode(str(rendered), add_special_tokens=False)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``."""
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))


def _config_vocab_size(path: Path) -> int:
    config = path / "config.json"
    if not config.is_file():
        return 0
    value = json.loads(config.read_text()).get("vocab_size", 0)
    return int(value) if isinstance(value, int) else 0
