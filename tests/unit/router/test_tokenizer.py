"""The router tokenizer's characters-per-token bound: a lower bound on any text's token count
(so the early length check never refuses a prompt that fits), or None where none holds."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from tandem.router.tokenizer import RouterTokenizer, max_token_chars

TOY_VOCAB = {"a": 0, "b": 1, "ab": 2, "abc": 3, "c": 4, "[UNK]": 5}


def _toy(**model: object) -> Tokenizer:
    return Tokenizer(models.BPE(vocab=TOY_VOCAB, merges=[("a", "b"), ("ab", "c")], **model))


def _texts(tokenizer: RouterTokenizer) -> list[str]:
    """Texts built to pack many characters into few tokens: runs of the longest tokens'
    text, whitespace and repeated symbols, special tokens, non-ASCII."""
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    longest = sorted(vocab.items(), key=lambda kv: len(kv[0]))[-50:]
    texts = [tokenizer.decode([i], skip_special_tokens=False) * 40 for _, i in longest]
    texts += ["#" * 5000, " " * 5000, "\n" * 3000, "\n" + " " * 4000, "=" * 3000,
              "<|im_start|>" * 200, "é" * 2000, "日本語のテキスト" * 300, "🙂" * 500,
              "the quick brown fox " * 300]
    return texts


def test_no_text_packs_more_characters_per_token_than_the_bound(
    tokenizer: RouterTokenizer,
) -> None:
    bound = tokenizer.max_token_chars
    assert bound is not None and bound >= 16  # byte-level BPE: a bound exists
    for text in _texts(tokenizer):
        ids = tokenizer.encode(text)
        assert len(ids) >= -(-len(text) // bound), (text[:40], len(text), len(ids))
        chat_ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(chat_ids) >= -(-len(text) // bound)


def test_bound_grows_with_the_normalizer_and_counts_added_tokens() -> None:
    assert max_token_chars(_toy()) == 5  # "[UNK]"
    nfc = _toy()
    nfc.normalizer = normalizers.NFC()  # composes up to 4 code points into one
    assert max_token_chars(nfc) == 20
    added = _toy()
    added.add_special_tokens([AddedToken("<|a_long_special|>")])
    assert max_token_chars(added) == len("<|a_long_special|>")
    halving = _toy()
    halving.normalizer = normalizers.Replace("  ", " ")
    assert max_token_chars(halving) == 10


def _strip() -> Tokenizer:
    t = _toy()
    t.normalizer = normalizers.Strip()
    return t


def _whitespace() -> Tokenizer:
    t = _toy()
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return t


def _removed() -> Tokenizer:
    t = _toy()
    t.pre_tokenizer = pre_tokenizers.Split("x", "removed")
    return t


def _swallowing() -> Tokenizer:
    t = _toy()
    t.add_special_tokens([AddedToken("<mask>", rstrip=True)])
    return t


@pytest.mark.parametrize(
    "build",
    [
        _strip,
        _whitespace,
        _removed,
        _swallowing,
        lambda: _toy(unk_token="[UNK]", fuse_unk=True),
        lambda: Tokenizer(models.WordPiece(vocab=TOY_VOCAB, unk_token="[UNK]")),
    ],
    ids=["strip", "whitespace", "split-removed", "rstrip-token", "fused-unk", "wordpiece"],
)
def test_tokenizers_that_can_fold_any_run_into_one_token_get_no_bound(build) -> None:
    assert max_token_chars(build()) is None
