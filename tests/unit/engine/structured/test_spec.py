"""StructuredOutput validation and the grammar engine's compile errors and cache."""

from __future__ import annotations

import pytest

from tandem.engine.errors import InvalidRequestError
from tandem.engine.structured.grammar_engine import GrammarEngine, choice_grammar
from tandem.engine.structured.spec import MAX_SPEC_CHARS, StructuredOutput


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (StructuredOutput("choice", ()), "structured_outputs.choice"),
        (StructuredOutput("choice", ("a", "")), "structured_outputs.choice"),
        (StructuredOutput("regex", ""), "structured_outputs.regex"),
        (StructuredOutput("regex", "a" * (MAX_SPEC_CHARS + 1)), "structured_outputs.regex"),
        (StructuredOutput("json_schema", "{oops"), "structured_outputs.json_schema"),
        (StructuredOutput("json_schema", "[1]"), "structured_outputs.json_schema"),
        (StructuredOutput("xml", "x"), "structured_outputs"),  # type: ignore[arg-type]
    ],
)
def test_bad_specs_name_their_field(spec: StructuredOutput, field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        spec.validate()
    assert err.value.field == field


@pytest.fixture(scope="module")
def grammars(tiny_vocab_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_vocab_dir))
    return GrammarEngine(tok, 49152, frozenset({2}))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (StructuredOutput("grammar", "root ::= ("), "EBNF parser error"),
        (StructuredOutput("regex", "(["), "Regex parsing error"),
        (StructuredOutput("json_schema", '{"type": "foo"}'), "Unsupported type"),
    ],
)
def test_what_does_not_compile_is_refused_with_the_reason(grammars, spec, words) -> None:
    with pytest.raises(InvalidRequestError) as err:
        grammars.compile(spec)
    assert words in err.value.message and "/project/" not in err.value.message


def test_choices_match_exactly_even_with_quotes_and_unicode(grammars) -> None:
    import xgrammar as xgr

    choices = ('say "hi"', "back\\slash", "日本語", "new\nline")
    assert choice_grammar(choices).startswith("root ::= ")
    compiled = grammars.compile(StructuredOutput("choice", choices))
    for c in choices:
        m = xgr.GrammarMatcher(compiled)
        assert m.accept_string(c) and m.is_completed(), c
    m = xgr.GrammarMatcher(compiled)
    assert not m.accept_string("say hi")


def test_compiled_grammars_are_cached(grammars) -> None:
    spec = StructuredOutput("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}')
    before = grammars.cache_bytes
    grammars.compile(spec)
    grown = grammars.cache_bytes
    grammars.compile(spec)
    assert grown > before and grammars.cache_bytes == grown


def test_bounded_json_strings_refuse_raw_control_characters(grammars) -> None:
    """xgrammar 0.2.9 lets U+0000-U+001F into maxLength strings; grammar_engine rewrites
    that rule (if a new version prints it differently, this fails instead of going quiet)."""
    import xgrammar as xgr

    from tandem.engine.structured.grammar_engine import _LOOSE_CHARS, json_schema_grammar

    schema = '{"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}, "required": ["a"]}'
    assert _LOOSE_CHARS in str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    compiled = grammars.compile(StructuredOutput("json_schema", schema))
    for text, ok in (('{"a": "ab"}', True), ('{"a": "a\x17"}', False), ('{"a": "a\nb"}', False)):
        m = xgr.GrammarMatcher(compiled)
        assert (m.accept_string(text) and m.is_completed()) == ok, text
    assert _LOOSE_CHARS not in json_schema_grammar(schema)
