"""The router's tokenizer: a local transformers tokenizer (never fetched from a hub).

The directory's ``tokenizer.json`` is loaded as written (transformers' ``TokenizersBackend``,
with ``tokenizer_config.json``'s special tokens and chat template), not through
``AutoTokenizer``: transformers' auto classes import torch, which the router never loads.
For a converted GGUF (tandem/router/model_files.py) that is the tokenizer the conversion saved; for
a checkpoint directory, the pipeline its authors serialized (``AutoTokenizer`` may instead
rebuild it from a model-specific class named in ``tokenizer_config.json``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.errors import InvalidRequestError
from tandem.router.tool_use import renders_tools, tools_prompt


class TokenizerLoadError(RuntimeError):
    """The tokenizer directory is missing or unreadable."""


class RouterTokenizer:
    """Encodes prompts (text or chat), decodes output ids, and knows the vocabulary size.

    ``backend`` is the ``tokenizers.Tokenizer`` underneath, what ``tandem.common.text.detokenizer``
    decodes output streams with (so a directory needs a fast tokenizer).

    ``vocab_size`` is the larger of the tokenizer's size and the model config's ``vocab_size``
    (when the directory has a config.json): any id the model can embed is a valid prompt id.

    ``max_token_chars`` is the most characters of prompt text one token can stand for (None
    when this tokenizer can fold an unbounded run of text into one token): a text prompt is
    at least ``len(text) / max_token_chars`` tokens, which refuses an oversize prompt before
    tokenizing it (validation.check_prompt_chars).

    Thread-safe for ``encode``/``render_chat``: the router runs them in a thread pool (the
    Rust tokenizer releases the GIL), and nothing here changes the tokenizer's settings.
    """

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        if not path.is_dir():
            raise TokenizerLoadError(f"tokenizer directory {str(path)!r} does not exist")
        try:
            self._tok: PreTrainedTokenizerBase = TokenizersBackend.from_pretrained(
                str(path), local_files_only=True
            )
        except (OSError, ValueError) as err:
            raise TokenizerLoadError(f"cannot load a tokenizer from {str(path)!r}: {err}") from err
        backend = getattr(self._tok, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise TokenizerLoadError(f"the tokenizer in {str(path)!r} is not a fast tokenizer")
        self.backend: Tokenizer = backend
        self.vocab_size = max(len(self._tok), _config_vocab_size(path))
        self.max_token_chars = max_token_chars(backend)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a raw text prompt (special tokens added as the engine adds them)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_chat(self, chat: Chat) -> list[int]:
        """Token ids of chat messages rendered through the tokenizer's chat template."""
        # The template already wrote any special tokens it wants.
        return self.encode(self.render_chat(chat), add_special_tokens=False)

    @property
    def chat_template(self) -> str | None:
        """The chat template's text (None when the model has none)."""
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) else None

    def render_chat(self, chat: Chat) -> str:
        """The prompt text of chat messages (the template's output, encoded without adding
        special tokens). Tools (``chat.tools_json``, already checked) go to the template, or
        into a system message when the template does not render them (tandem/router/tool_use.py)."""
        template = self.chat_template
        if not template:
            raise InvalidRequestError("chat", "this model has no chat template")
        messages = [_message(m) for m in chat.messages]
        tools = json.loads(chat.tools_json) if chat.tools_json else None
        if tools and not renders_tools(template):
            messages = _with_tools_prompt(messages, tools_prompt(tools))
            tools = None
        rendered = self._tok.apply_chat_template(
            messages, tools=tools, tokenize=False,
            add_generation_prompt=chat.add_generation_prompt,
            **self._template_kwargs(chat),
        )
        return str(rendered)

    def _template_kwargs(self, chat: Chat) -> dict[str, Any]:
        """The chat's extra template variables; a name ``apply_chat_template`` takes itself
        (messages, tools, tokenize ...) is refused, never passed (checked here too: the edge
        refuses the common ones, this tokenizer's own signature is the whole list)."""
        extra = dict(chat.template_kwargs)
        taken = sorted(set(extra) & _apply_chat_template_params(self._tok))
        if taken:
            raise InvalidRequestError("chat_template_kwargs",
                                      f"{', '.join(taken)}: set by the request itself")
        return extra

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``."""
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))


def _apply_chat_template_params(tok: PreTrainedTokenizerBase) -> frozenset[str]:
    """The named parameters of ``tok.apply_chat_template`` (its **kwargs go to the template)."""
    params = inspect.signature(tok.apply_chat_template).parameters.values()
    named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return frozenset(named | {"messages"})  # what the template gets the conversation as


def _message(m: ChatMessage) -> dict[str, Any]:
    """A chat message as HF chat templates read it (tool calls' arguments as objects)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name:
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in m.tool_calls
        ]
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _with_tools_prompt(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """The tools' description appended to the system message (or as the first one)."""
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


# Normalizers that never shrink text, and the few that shrink it by a bounded factor: NFC and
# NFKC compose a base character and its marks into one, and no composite stands for more
# than 4 code points (U+1F82 = alpha + 3 marks). Any other normalizer (Strip, StripAccents,
# Bert, Precompiled, Nmt: they delete characters) leaves the text without a bound.
_NORMALIZER_FACTOR = {"NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1,
                      "NFC": 4, "NFKC": 4}
# Pre-tokenizers that keep every character (Whitespace, WhitespaceSplit, Bert and
# CharDelimiterSplit drop some; Split drops its matches when behavior is "Removed").
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts", "Split"}
)


def max_token_chars(backend: Tokenizer) -> int | None:
    """The most characters of input text one token of ``backend`` can stand for, or None.

    A token's vocabulary string is at least as long as the text it came from: byte-level
    tokens spell one byte per character (and a character is one byte or more), others spell
    the text itself ("▁" for a space, "##" prefixes and "<0x41>" byte tokens only add).
    That holds only where nothing before the model removes or merges characters and the model
    has no catch-all token for an unknown run, so any tokenizer outside those cases (checked
    from its serialized spec) gets None: no bound, no early refusal.
    """
    spec = json.loads(backend.to_str())
    factor = _normalizer_factor(spec.get("normalizer"))
    if factor is None or not _keeps_characters(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model") or {}
    if model.get("type") == "BPE":
        if model.get("unk_token") and model.get("fuse_unk") and not model.get("byte_fallback"):
            return None  # a run of unknown characters becomes one token
    elif not (model.get("type") == "Unigram" and model.get("byte_fallback")):
        return None  # WordPiece/WordLevel/Unigram: a whole unknown word can be one token
    for added in spec.get("added_tokens") or ():
        if added.get("lstrip") or added.get("rstrip"):
            return None  # the token swallows the whitespace next to it, however long
    longest = max((len(t) for t in backend.get_vocab(with_added_tokens=True)), default=0)
    return longest * factor if longest > 0 else None


def _normalizer_factor(spec: dict[str, Any] | None) -> int | None:
    """How many characters of input one character of normalized text stands for at most."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        total = 1
        for part in spec.get("normalizers") or ():
            factor = _normalizer_factor(part)
            if factor is None:
                return None
            total *= factor
        return total
    if kind == "Replace":
        pattern, content = spec.get("pattern") or {}, spec.get("content") or ""
        literal = pattern.get("String")
        if not isinstance(literal, str) or not literal or not content:
            return None  # a regex, or a deletion
        return -(-len(literal) // len(content))
    return _NORMALIZER_FACTOR.get(str(kind))


def _keeps_characters(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_keeps_characters(part) for part in spec.get("pretokenizers") or ())
    if kind == "Split" and str(spec.get("behavior")).lower() == "removed":
        return False
    return kind in _KEEPING_PRE_TOKENIZERS


def _config_vocab_size(path: Path) -> int:
    config = path / "config.json"
    if not config.is_file():
        return 0
    value = json.loads(config.read_text()).get("vocab_size", 0)
    return int(value) if isinstance(value, int) else 0
